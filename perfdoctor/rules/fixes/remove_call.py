"""Fix kind "remove-call": delete a call statement (`torch.cuda.empty_cache()`, or the `callee` the rule
names, e.g. `gc.collect`), keeping the block valid."""

from __future__ import annotations

import libcst as cst

from perfdoctor.facts.static.empty_cache import EMPTY_CACHE
from perfdoctor.rules.fixes.context import Context, dotted


def fix(ctx: Context, params: dict):
    if not isinstance(ctx.stmt, cst.SimpleStatementLine):
        return None
    callee = params.get("callee")

    def target(s: cst.BaseSmallStatement) -> bool:
        if not (isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)):
            return False
        d = dotted(s.value.func) or ""
        return (d == callee or d.endswith("." + str(callee))) if callee else ctx.qual(s.value.func) in EMPTY_CACHE

    keep = [s for s in ctx.stmt.body if not target(s)]
    if len(keep) == len(ctx.stmt.body):
        return None
    note = "" if callee else (  # a named callee: the rule's own note says why
            "`torch.cuda.empty_cache()` frees no memory your tensors hold: it hands the allocator's cached blocks "
            "back to the driver, and the next steps pay for cudaMalloc and a device sync to get them again. "
            "Call it once outside the training loop if another process needs the memory.")
    if keep:
        keep = [s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for s in keep]
        return ctx.stmt.with_changes(body=keep), note
    # the call was the whole statement: remove it, and the `if` (no `else`) whose body it was alone
    # in, up to the block that still has other statements; `pass` only where a block would be empty
    while True:
        block, _ = ctx.block()
        parent = ctx.parents.get(ctx.stmt)
        owner = ctx.parents.get(parent) if isinstance(parent, cst.IndentedBlock) else None
        if len(block) == 1 and isinstance(owner, cst.If) and owner.orelse is None:
            ctx.widen(owner)
            continue
        return (ctx.indent() + "pass" if len(block) == 1 else ""), note
