"""Fix kind "defer-host-read" (PD008): a value read to the host every step (`acc = (p == y).float().mean().item()`)
stays a device tensor (`.item()` becomes `.detach()`), so that the step no longer waits for the GPU;
the note says to read it where it is logged, every N steps. Only an assignment (`x = ...`, `x += ...`)
holding one `.item()` call is rewritten: a print, a format or a test of the value needs the number
there, and gets the rule's words instead (None here)."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from perfdoctor.rules.fixes.context import Context

_ITEM = m.Call(func=m.Attribute(attr=m.Name("item")), args=())


def fix(ctx: Context, params: dict):
    if not isinstance(ctx.stmt, cst.SimpleStatementLine) or len(ctx.stmt.body) != 1:
        return None
    small = ctx.stmt.body[0]
    if not isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)) or small.value is None:
        return None
    reads = m.findall(small.value, _ITEM)
    if len(reads) != 1 or m.findall(small.value, m.FormattedString()):
        return None
    call = reads[0]
    assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
    detached = call.with_changes(func=call.func.with_changes(attr=cst.Name("detach")))
    target = (ctx.code(small.targets[0].target) if isinstance(small, cst.Assign)
              else ctx.code(small.target))
    note = (f"`{target}` stays a tensor on the device: add it up there and call .item() only where it is logged, "
            f"every N steps (one sync then, not one per step); {params.get('note', '')}").rstrip("; ")
    return ctx.stmt.deep_replace(call, detached), note
