"""Fix kind "enable-tf32": the statement that turns TF32 off, turned on in place:
`torch.backends.cuda.matmul.allow_tf32 = False` and `torch.backends.cudnn.allow_tf32 = False` get `True`,
`torch.set_float32_matmul_precision("highest")` gets `"high"` (the quotes as written). The rest of the
statement (other targets of a `;` line, a comment) is kept. None where the statement is none of these."""

from __future__ import annotations

import libcst as cst

from perfdoctor.rules.fixes.context import Context, dotted

PRECISION = "set_float32_matmul_precision"


def _on(s: cst.BaseSmallStatement) -> cst.BaseSmallStatement | None:
    if (isinstance(s, cst.Assign) and isinstance(s.value, cst.Name) and s.value.value == "False"
            and all((dotted(t.target) or "").endswith(".allow_tf32") for t in s.targets)):
        return s.with_changes(value=cst.Name("True"))
    if isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and (dotted(s.value.func) or "").endswith(PRECISION):
        args = list(s.value.args)
        if len(args) == 1 and isinstance(args[0].value, cst.SimpleString) and args[0].value.evaluated_value == "highest":
            q = args[0].value.quote
            new = args[0].with_changes(value=cst.SimpleString(f"{args[0].value.prefix}{q}high{q}"))
            return s.with_changes(value=s.value.with_changes(args=[new]))
    return None


def fix(ctx: Context, params: dict):
    if not isinstance(ctx.stmt, cst.SimpleStatementLine):
        return None
    body, changed = [], False
    for s in ctx.stmt.body:
        new = _on(s)
        changed |= new is not None
        body.append(new if new is not None else s)
    if not changed:
        return None
    return ctx.stmt.with_changes(body=body), str(params.get("note", ""))
