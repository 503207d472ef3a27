"""The GPU clock probe's records (capture/probes/gpu_clock.py, NVML) -> `gpu.sm_clock_mhz`,
`gpu.sm_clock_max_mhz`, `gpu.throttled_share` and `gpu.throttle_reasons` on the steady steps: a
straggler rank's "GPU throttling"."""

from __future__ import annotations

import statistics

from perfdoctor.facts.run.context import RunContext

# NVML's clock throttle reasons that slow a busy GPU down (nvmlClocksEventReasons): power and heat.
# The others (idle, application clocks, sync boost, display clock) are not a slowdown of its work.
GPU_THROTTLE_REASONS = ((0x4, "power cap"), (0x8, "hardware slowdown"), (0x20, "thermal (software)"),
                        (0x40, "thermal (hardware)"), (0x80, "power brake"))


def add(ctx: RunContext) -> None:
    g, facts = ctx.probes.gpu_clock, ctx.facts
    if g is None or not g.by_step:
        return
    idx = {int(x["i"]) for x in ctx.steady}
    rows = [r for r in g.by_step if int(r[0]) in idx]
    which = f"{len(rows)} readings (NVML) at steady step ends"
    if not rows:  # readings a few times a second: a short run may have none on its steady steps
        rows, which = g.by_step, f"{len(g.by_step)} readings (NVML) at step ends, none on a steady step"
    facts.add("gpu.sm_clock_mhz", statistics.median(r[1] for r in rows), "number",
              detail=f"median of {which}" + (f", of at most {g.max_mhz:.0f} MHz" if g.max_mhz else ""))
    if g.max_mhz:
        facts.add("gpu.sm_clock_max_mhz", g.max_mhz, "number", detail="the device's maximum SM clock (NVML)")
    slow = [r for r in rows if int(r[2]) & sum(bit for bit, _ in GPU_THROTTLE_REASONS)]
    facts.add("gpu.throttled_share", len(slow) / len(rows), "ratio",
              detail=f"of {which}, those with a power or thermal clock throttle reason")
    seen = 0
    for r in slow:
        seen |= int(r[2])
    names = [name for bit, name in GPU_THROTTLE_REASONS if seen & bit]
    if names:
        facts.add("gpu.throttle_reasons", ", ".join(names), "str", detail=f"set on {len(slow)} of {which}")
