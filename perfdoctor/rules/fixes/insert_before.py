"""Fix kind "insert-before": put one statement (`params["statement"]`, e.g.
`torch.backends.cudnn.benchmark = True`) on its own line before the flagged statement, at its
indentation. None where the file does not import the statement's first name (`torch`) or already
holds the statement."""

from __future__ import annotations

from perfdoctor.rules.fixes.context import Context


def fix(ctx: Context, params: dict):
    statement = str(params["statement"]).strip()
    head = statement.split(".", 1)[0]
    if ctx.index.aliases.get(head) != head:
        return None  # `torch` is not imported under that name here
    if any(" ".join(line.split()) == " ".join(statement.split()) for line in ctx.lines):
        return None
    before = ctx.render(ctx.stmt)
    return f"{ctx.indent()}{statement}\n{before}", str(params.get("note", ""))
