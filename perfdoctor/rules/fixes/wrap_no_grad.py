"""Fix kind "wrap-no-grad": put the statement that runs a forward for evaluation in `with torch.no_grad():`
(`params["context"]` may name another context manager, e.g. `torch.inference_mode()`)."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from perfdoctor.rules.fixes.context import Context
from perfdoctor.rules.fixes.wrap_autocast import _shift


def fix(ctx: Context, params: dict):
    if not isinstance(ctx.stmt, cst.SimpleStatementLine) or not all(
            isinstance(s, (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Expr, cst.Return)) for s in ctx.stmt.body) \
            or not m.findall(ctx.stmt, m.Call()):
        return None  # only a statement that computes something (the forward call)
    context = str(params.get("context", "torch.no_grad()"))
    torch_names = [k for k, v in ctx.index.aliases.items() if v == "torch"]
    t = "torch" if "torch" in torch_names or not torch_names else torch_names[0]
    if context.startswith("torch."):
        context = t + context[5:]
    inner = _shift(ctx.render(ctx.stmt), ctx.module.default_indent)
    if inner is None:
        return None
    after = f"{ctx.indent()}with {context}:\n{inner}"
    note = ("or decorate the evaluation function with `@" + context + "`; anything computed from the output "
            "inside or after the block records no graph either")
    if not torch_names:
        note = "add `import torch`; " + note
    return after, note
