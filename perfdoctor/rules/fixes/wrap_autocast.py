"""Fix kind "wrap-autocast": put the statement that computes (a forward, a loss) in `with torch.autocast(...)`."""

from __future__ import annotations

import io
import textwrap
import tokenize

import libcst as cst
import libcst.matchers as m

from perfdoctor.rules.fixes.context import Context


def fix(ctx: Context, params: dict):
    if not isinstance(ctx.stmt, cst.SimpleStatementLine) or not all(
            isinstance(s, (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Expr, cst.Return)) for s in ctx.stmt.body) \
            or not m.findall(ctx.stmt, m.Call()):
        return None  # only statements that compute something (a forward, a loss)
    device_type = str(params.get("device_type", "cuda"))
    dtype = str(params.get("dtype", "torch.bfloat16"))
    torch_names = [k for k, v in ctx.index.aliases.items() if v == "torch"]
    t = "torch" if "torch" in torch_names or not torch_names else torch_names[0]
    if dtype.startswith("torch."):
        dtype = t + dtype[5:]
    unit = ctx.module.default_indent
    inner = _shift(ctx.render(ctx.stmt), unit)
    if inner is None:
        return None
    after = f'{ctx.indent()}with {t}.autocast(device_type="{device_type}", dtype={dtype}):\n{inner}'
    if dtype.endswith(("float16", ".half")) and not dtype.endswith("bfloat16"):
        note = (f'float16 needs a GradScaler: `scaler = {t}.amp.GradScaler("{device_type}")`, then '
                "`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, `scaler.update()`")
    else:
        note = "keep `loss.backward()` and the optimizer step outside the block; bfloat16 needs no GradScaler"
    if not torch_names:
        note = "add `import torch`; " + note
    return after, note


def _shift(code: str, unit: str) -> str | None:
    """Indent the lines of a statement by `unit`, except lines inside multi-line strings."""
    lines = code.split("\n")
    inside: set[int] = set()  # 1-based rows that continue a string token
    try:
        for tok in tokenize.generate_tokens(io.StringIO(textwrap.dedent(code) + "\n").readline):
            if tok.type == tokenize.STRING or getattr(tokenize, "FSTRING_MIDDLE", -1) == tok.type:
                inside |= set(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        return None
    return "\n".join(l if (i + 1) in inside or not l.strip() else unit + l for i, l in enumerate(lines))
