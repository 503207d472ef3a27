"""Fix kind "detach-loss": keep `loss.item()` (or `loss.detach()`) in a holder instead of the loss with its graph.

`.item()` makes the holder a Python float, which is right only where the holder is used as a number
later; where the script uses it as a tensor (`total.item()`, `avg = total / n; avg.item()`,
`torch.stack(losses)`), the fix keeps a tensor without its graph: `.detach()`."""

from __future__ import annotations

import ast

import libcst as cst

from perfdoctor.rules.fixes.context import Context

# attributes of a tensor that a float (or a list of floats) does not have
_TENSOR_ATTRS = frozenset({
    "item", "detach", "cpu", "cuda", "numpy", "tolist", "backward", "to", "mean", "sum", "std", "var",
    "size", "shape", "dim", "numel", "clone", "float", "half", "double", "view", "reshape", "squeeze",
    "unsqueeze", "log", "exp", "sqrt", "abs", "zero_", "add_", "div_", "mul_", "device", "dtype",
    "requires_grad", "grad", "data", "isnan", "isfinite", "norm", "max", "min", "argmax",
})


def used_as_tensor(ctx: Context, holders: set[str]) -> bool:
    """Whether the enclosing function (or module) uses a holder, or a name computed from one
    (`avg = total / n`), as a tensor: a tensor-only attribute, or an argument of a torch function."""
    line = ctx.line
    scope: ast.AST = ctx.index.tree
    for node in ctx.index.nodes:
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line
                and (node.end_lineno or 0) >= line and node.lineno >= getattr(scope, "lineno", 0)):
            scope = node
    nodes = [n for n in ast.walk(scope) if getattr(n, "lineno", line) != line]
    names = set(holders)
    for _ in range(3):  # names derived from a holder: `avg = total / n`, `mean_loss = sum(losses) / len(losses)`
        for n in nodes:
            if isinstance(n, ast.Assign) and any(isinstance(m, ast.Name) and m.id in names for m in ast.walk(n.value)):
                names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    for n in nodes:
        if (isinstance(n, ast.Attribute) and n.attr in _TENSOR_ATTRS and isinstance(n.value, ast.Name)
                and n.value.id in names):
            return True
        if isinstance(n, ast.Call) and (ctx.index.qual(n.func) or "").startswith("torch.") and any(
                isinstance(a, ast.Name) and a.id in names for a in n.args):
            return True
    return False


def _holders(stmt: cst.SimpleStatementLine) -> set[str]:
    """The names the statement stores into: `total` in `total += loss`, `losses` in `losses.append(loss)`."""
    out: set[str] = set()
    for s in stmt.body:
        if isinstance(s, cst.AugAssign) and isinstance(s.target, cst.Name):
            out.add(s.target.value)
        elif isinstance(s, cst.Assign):
            out |= {t.target.value for t in s.targets if isinstance(t.target, cst.Name)}
        elif (isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and isinstance(s.value.func, cst.Attribute)
              and isinstance(s.value.func.value, cst.Name)):
            out.add(s.value.func.value.value)
    return out


def fix(ctx: Context, params: dict):
    name, method = str(params["name"]), str(params.get("method", "item"))
    if method not in ("item", "detach") or not isinstance(ctx.stmt, cst.SimpleStatementLine):
        return None
    if method == "item" and used_as_tensor(ctx, _holders(ctx.stmt)):
        method = "detach"
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
