"""Fix kind "factory-device": a tensor built on the CPU, then moved (`torch.randn(n).cuda()`, or
`x = torch.zeros(n)` then `x = x.to(device)`), is built on the device with `device=`."""

from __future__ import annotations

import ast
from typing import TypeGuard

import libcst as cst
import libcst.matchers as m

from perfdoctor.facts.static.cpu_to_device import FACTORIES
from perfdoctor.rules.fixes.context import Context, kw, names, set_kwargs


def _is_factory(expr: cst.BaseExpression, ctx: Context) -> TypeGuard[cst.Call]:
    """Whether `expr` calls a torch tensor factory with no `device=` and no `**kwargs` (the argument
    this guard narrows comes first)."""
    if not isinstance(expr, cst.Call):
        return False
    q = ctx.qual(expr.func)
    return (q is not None and q.startswith("torch.") and q[6:] in FACTORIES and kw(expr, "device") is None
            and not any(a.star == "**" for a in expr.args))


def _device_dtype(ctx: Context, move: cst.Call) -> tuple[cst.BaseExpression, cst.BaseExpression | None] | None:
    """(device, dtype or None) of a `.cuda(...)` / `.to(...)` call; None when it is not a device move
    or carries arguments a factory cannot take (memory_format, a tensor)."""
    if not isinstance(move.func, cst.Attribute):
        return None
    if move.func.attr.value == "cuda":
        arg = (kw(move, "device") or (move.args[0] if move.args and not move.args[0].keyword else None))
        if arg is None:
            return cst.SimpleString('"cuda"'), None
        d = ctx.to_ast(arg.value)
        if isinstance(d, ast.Constant) and type(d.value) is int:
            return cst.SimpleString(f'"cuda:{d.value}"'), None
        return arg.value, None
    if any(a.keyword is not None and a.keyword.value not in ("device", "dtype", "non_blocking", "copy")
           for a in move.args) or any(a.star for a in move.args):
        return None
    positional = [a.value for a in move.args if a.keyword is None]
    dev_arg, dtype_arg = kw(move, "device"), kw(move, "dtype")
    dev = dev_arg.value if dev_arg else None
    dtype = dtype_arg.value if dtype_arg else None
    for p in positional[:2]:
        node = ctx.to_ast(p)
        if ctx.index.devices.is_dtype(node) and dtype is None:
            dtype = p
        elif dev is None and ctx.index.devices.device_expr(node) is True:
            dev = p
        else:
            return None
    if dev is None or ctx.index.devices.device_expr(ctx.to_ast(dev)) is not True:
        return None
    return dev, dtype


def _on_device(ctx: Context, factory: cst.Call, move: cst.Call) -> cst.Call | None:
    dd = _device_dtype(ctx, move)
    if dd is None:
        return None
    dev, dtype = dd
    new: dict[str, cst.BaseExpression] = {"device": dev}
    if dtype is not None:
        new["dtype"] = dtype
    return factory.with_changes(args=set_kwargs(factory.args, new))


def fix(ctx: Context, params: dict):
    for call in ctx.calls():  # torch.randn(a, b).cuda() / torch.zeros(n).to(device)
        f = call.func
        if isinstance(f, cst.Attribute) and f.attr.value in ("cuda", "to") and _is_factory(f.value, ctx):
            new = _on_device(ctx, f.value, call)
            if new is not None:
                return ctx.stmt.deep_replace(call, new), ""
    # x = torch.randn(...)  ...  x = x.to(device)
    if not isinstance(ctx.stmt, cst.SimpleStatementLine) or len(ctx.stmt.body) != 1:
        return None
    assign = ctx.stmt.body[0]
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    target, factory = assign.targets[0].target, assign.value
    if not (isinstance(target, cst.Name) and _is_factory(factory, ctx)):
        return None
    name = target.value
    block, i = ctx.block()
    assigned_between: set[str] = set()
    for later in block[i + 1:i + 6] if i >= 0 else []:
        move = None
        first = later.body[0] if isinstance(later, cst.SimpleStatementLine) and len(later.body) == 1 else None
        if isinstance(first, cst.Assign) and isinstance(first.value, cst.Call) and m.matches(first, m.Assign(
                targets=[m.AssignTarget(target=m.Name(name))],
                value=m.Call(func=m.Attribute(value=m.Name(name), attr=m.Name("to") | m.Name("cuda"))))):
            move = first.value
        if move is not None:
            new = _on_device(ctx, factory, move)
            if new is None or (names(ctx, move) - {name}) & assigned_between:
                return None
            line = ctx.pos[later].start.line
            code = ctx.code(later.with_changes(leading_lines=())).strip()
            return (ctx.stmt.deep_replace(factory, new),
                    f"then delete line {line} (`{code}`): the tensor is already on the device")
        if not isinstance(later, cst.SimpleStatementLine) or name in names(ctx, later):
            return None
        assigned_between |= {v for t in m.findall(later, m.AssignTarget()) for v in names(ctx, t)}
    return None
