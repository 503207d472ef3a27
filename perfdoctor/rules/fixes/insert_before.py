"""Fix kind "insert-before": put one statement (`params["statement"]`, e.g.
`torch.backends.cudnn.benchmark = True`, a setting made once at start-up) on its own line at module
level, before the top-level statement that holds the flagged line: never inside a model's
`__init__`, a helper or a loop, where it would run again at every call or iteration. The fix is
that line and the statement before it. None where the file does not import the statement's first
name (`torch`) or already holds the statement."""

from __future__ import annotations

import libcst as cst

from perfdoctor.rules.fixes.context import Context


def fix(ctx: Context, params: dict):
    statement = str(params["statement"]).strip()
    head = statement.split(".", 1)[0]
    if ctx.index.aliases.get(head) != head:
        return None  # `torch` is not imported under that name here
    if any(" ".join(line.split()) == " ".join(statement.split()) for line in ctx.lines):
        return None
    top: cst.CSTNode = ctx.stmt
    while (parent := ctx.parents.get(top)) is not None and not isinstance(parent, cst.Module):
        top = parent
    if not isinstance(top, cst.BaseStatement):
        return None
    if top is ctx.stmt and not isinstance(top, (cst.FunctionDef, cst.ClassDef)):
        return f"{statement}\n{ctx.render(ctx.stmt)}", str(params.get("note", ""))
    first = ctx.pos[top].start.line  # its first line (a decorator's, for a decorated class or function)
    ctx.before_text = ctx.lines[first - 1]
    return f"{statement}\n{ctx.before_text}", str(params.get("note", ""))
