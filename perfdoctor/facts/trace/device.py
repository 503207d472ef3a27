"""The device: type, and from the trace's deviceProperties its name, count, capability, memory."""

from __future__ import annotations

from perfdoctor.facts.trace.context import TraceContext


def add(ctx: TraceContext) -> None:
    t, put = ctx.trace, ctx.put
    put("device.type", t.device_type)
    if not t.device_properties:
        return
    p = t.device_properties[0]
    put("device.name", str(p.get("name", "")) or None)
    put("device.count", len(t.device_properties), "count", "deviceProperties entries")
    cap = None
    if isinstance(p.get("computeMajor"), int) and isinstance(p.get("computeMinor"), int):
        cap = float(f"{p['computeMajor']}.{p['computeMinor']}")
    put("device.capability", cap)
    if isinstance(p.get("totalGlobalMem"), int):
        put("device.memory_bytes", p["totalGlobalMem"], "bytes")
    if cap is not None:
        put("device.amp_available", cap >= 7.0 if t.device_type == "cuda" else cap >= 9.0)
