"""Fix kind "non-blocking": add `non_blocking=True` to the device moves of a statement."""

from __future__ import annotations

import ast

import libcst as cst
import libcst.matchers as m

from perfdoctor.rules.fixes.context import Context, kw, set_kwargs


def fix(ctx: Context, params: dict):
    targets = []
    for call in ctx.calls():
        f = call.func
        if not isinstance(f, cst.Attribute) or f.attr.value not in ("to", "cuda"):
            continue
        if f.attr.value == "to":
            dev = kw(call, "device") or next((a for a in call.args if a.keyword is None), None)
            if dev is None:
                continue
            node = ctx.to_ast(dev.value)
            verdict = ctx.index.devices.device_expr(node)
            if not (verdict is True or (verdict is None and isinstance(node, (ast.Name, ast.Attribute))
                                        and not ctx.index.devices.is_dtype(node))):
                continue
        nb = kw(call, "non_blocking")
        if nb is None or not m.matches(nb.value, m.Name("True")):
            targets.append(call)
    if not targets:
        return None

    class AddNonBlocking(cst.CSTTransformer):
        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
            if any(original is t for t in targets):
                return updated.with_changes(args=set_kwargs(updated.args, {"non_blocking": cst.Name("True")}))
            return updated

    # no note: PD017, its rule, fires only on a pinned DataLoader's batches (non_blocking=True overlaps
    # the copy only from pinned memory, and saying "pin it too" there was wrong)
    return ctx.stmt.visit(AddNonBlocking()), ""
