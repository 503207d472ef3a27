"""Fix kind "detach-loss": keep `loss.item()` (or `loss.detach()`) in a holder instead of the loss with its graph."""

from __future__ import annotations

import libcst as cst

from perfdoctor.rules.fixes.context import Context


def fix(ctx: Context, params: dict):
    name, method = str(params["name"]), str(params.get("method", "item"))
    if method not in ("item", "detach") or not isinstance(ctx.stmt, cst.SimpleStatementLine):
        return None
    replaced = []

    def bare(e: cst.BaseExpression) -> cst.BaseExpression:
        if isinstance(e, cst.Name) and e.value == name:
            replaced.append(e)
            return cst.parse_expression(f"{name}.{method}()").with_changes(lpar=e.lpar, rpar=e.rpar)
        if isinstance(e, cst.BinaryOperation):
            return e.with_changes(left=bare(e.left), right=bare(e.right))
        if isinstance(e, cst.UnaryOperation):
            return e.with_changes(expression=bare(e.expression))
        if isinstance(e, (cst.Tuple, cst.List)):
            return e.with_changes(elements=[el.with_changes(value=bare(el.value)) for el in e.elements])
        return e

    body = []
    for s in ctx.stmt.body:
        if isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and isinstance(s.value.func, cst.Attribute):
            s = s.with_changes(value=s.value.with_changes(
                args=[a.with_changes(value=bare(a.value)) for a in s.value.args]))
        elif isinstance(s, (cst.AugAssign, cst.Assign)):
            s = s.with_changes(value=bare(s.value))
        body.append(s)
    if not replaced:
        return None
    note = (f"`{name}.item()` copies one number to the host (a sync each time); to avoid the sync keep "
            f"`{name}.detach()` and convert when you log" if method == "item" else
            f"`{name}.detach()` keeps the value on the device without its autograd graph")
    return ctx.stmt.with_changes(body=body), note
