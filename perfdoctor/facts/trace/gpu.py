"""GPU utilization and idle time per step, device by device, the idle split into host wait (the
next GPU event was launched after the gap began) and gaps between kernels (launched in time,
waiting on something else).

On a trace alone every number is the profiled steps'. In a run folder (`ctx.run_step_ms`), the
profiled steps' host time is inflated by the profiler (shapes, stacks, CUPTI, the line sampler)
while the GPU's is not: the GPU's busy time comes from the trace, the step from the run's
unprofiled steps, the GPU idles for the difference, and that idle time is split into host wait and
gaps in the proportions the trace shows."""

from __future__ import annotations

from bisect import bisect_right

from perfdoctor.contracts.report import GpuDeviceDoc, GpuDoc, SummaryDoc
from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.stats import breakdown, breakdown_rows, median


def _per_step(ctx: TraceContext, events: list[int]) -> tuple[list[float], list[float], list[float]]:
    """Busy, host-wait and gap ms of one device's events in each step window."""
    t, windows, launches = ctx.trace, ctx.windows, ctx.launches
    ts, dur, corr = t.ts, t.dur, t.corr
    blocks: list[list[float]] = []  # [start, end, launch ts of the block's first event]
    for i in sorted(events, key=ts.__getitem__):
        s, e = ts[i], ts[i] + dur[i]
        if blocks and s <= blocks[-1][1]:
            if e > blocks[-1][1]:
                blocks[-1][1] = e
        else:
            r = launches.get(corr[i])
            blocks.append([s, e, t.ts[r] if r is not None else s])
    busy, host, gap = [], [], []
    starts = [b[0] for b in blocks]
    for ws, we in windows:
        j = max(bisect_right(starts, ws) - 1, 0)
        cur, b_ms, h_ms, g_ms = ws, 0.0, 0.0, 0.0
        while j < len(blocks) and blocks[j][0] < we:
            s, e, launched = blocks[j]
            if e > ws:
                s2 = max(s, ws)
                if s2 > cur:
                    if launched > cur:
                        h_ms += s2 - cur
                    else:
                        g_ms += s2 - cur
                b_ms += min(e, we) - s2
                cur = max(cur, min(e, we))
            j += 1
        if we > cur:  # tail of the step with nothing on the GPU: the host has not launched more
            h_ms += we - cur
        busy.append(b_ms / 1000)
        host.append(h_ms / 1000)
        gap.append(g_ms / 1000)
    return busy, host, gap


def _device(ctx: TraceContext, events: list[int]) -> dict[str, float] | None:
    """One device's medians per step: busy, idle, host wait, gap (ms) and utilization."""
    busy, host, gap = _per_step(ctx, events)
    busy_med = median(busy)
    if busy_med is None:  # no steps
        return None
    run = ctx.run_step_ms
    if run:
        tot = sum(host) + sum(gap)
        host_share = sum(host) / tot if tot else 1.0
        idle = max(0.0, run - busy_med)
        return {"busy_ms": busy_med, "idle_ms": idle, "host_wait_ms": idle * host_share,
                "gap_ms": idle * (1 - host_share), "utilization": min(1.0, busy_med / run),
                "host_wait_fraction": host_share}
    util = [b / sm if sm else 0.0 for b, sm in zip(busy, ctx.step_ms)]
    tot = sum(host) + sum(gap)
    return {"busy_ms": busy_med, "idle_ms": median([sm - b for sm, b in zip(ctx.step_ms, busy)]) or 0.0,
            "host_wait_ms": median(host) or 0.0, "gap_ms": median(gap) or 0.0, "utilization": median(util) or 0.0,
            "host_wait_fraction": sum(host) / tot if tot else 0.0}


def add(ctx: TraceContext, gpu_parts: dict[str, float], summary: SummaryDoc) -> None:
    """gpu.busy_ms, the gpu.* idle facts and step.idle_ms (the busiest device's); sets the
    summary's `gpu` (a row per device where there are several) and, in a run folder, replaces its
    breakdown with the GPU breakdown of the run's step (nothing without steps)."""
    put, dev = ctx.put, ctx.trace.device
    per: dict[int, dict[str, float]] = {}
    for d in ctx.devices:
        m = _device(ctx, [i for i in ctx.gpu_events if dev[i] == d] if len(ctx.devices) > 1 else ctx.gpu_events)
        if m is not None:
            per[d] = m
    if not per:
        return
    main = per[ctx.main_device] if ctx.main_device in per else next(iter(per.values()))
    n, run = ctx.nsteps, ctx.run_step_ms
    several = f" on the busiest of {len(per)} GPUs" if len(per) > 1 else ""
    trace_steps = f"median over the trace's {n} profiled steps{several}"
    put("gpu.busy_ms", main["busy_ms"], "ms", f"GPU busy (kernels, copies, memsets) per step, {trace_steps}")
    if run:
        idle_src = f"the run's median step (steady steps, unprofiled) less the GPU's busy time ({trace_steps})"
        put("gpu.utilization", main["utilization"], "ratio", f"GPU busy / step: {idle_src}")
        put("step.idle_ms", main["idle_ms"], "ms", f"GPU idle per step: {idle_src}")
        put("gpu.idle_host_wait_ms", main["host_wait_ms"], "ms",
            "GPU idle while the next work was not launched yet: step.idle_ms split as in the profiled steps")
        put("gpu.idle_gap_ms", main["gap_ms"], "ms",
            "GPU idle although the next work was already launched: step.idle_ms split as in the profiled steps")
    else:
        put("gpu.utilization", main["utilization"], "ratio", "GPU busy (kernels, copies, memsets) / step" + several)
        put("step.idle_ms", main["idle_ms"], "ms", "GPU idle per step" + several)
        put("gpu.idle_host_wait_ms", main["host_wait_ms"], "ms", "GPU idle while the next work was not launched yet")
        put("gpu.idle_gap_ms", main["gap_ms"], "ms", "GPU idle although the next work was already launched")
    summary.gpu = GpuDoc(utilization=round(main["utilization"], 4), idle_ms=round(main["idle_ms"], 3),
                         idle_host_wait_fraction=round(main["host_wait_fraction"], 4))
    if len(per) > 1:
        summary.gpu.devices = [GpuDeviceDoc(device=d, utilization=round(m["utilization"], 4),
                                            busy_ms=round(m["busy_ms"], 3), idle_ms=round(m["idle_ms"], 3))
                               for d, m in sorted(per.items())]
    if run:  # the run's step on the GPU: its busy categories from the trace, the rest idle
        parts = {**{c: ms for c, ms in gpu_parts.items() if ms}, "idle: waiting on the host": main["host_wait_ms"],
                 "idle: launched, waiting": main["gap_ms"]}
        summary.breakdown = breakdown_rows(breakdown(parts, run), run)
