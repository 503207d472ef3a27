"""GPU utilization and idle time per step, the idle split into host wait (the next GPU event was
launched after the gap began) and gaps between kernels (launched in time, waiting on something else)."""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.stats import median


def add(ctx: TraceContext) -> dict[str, Any]:
    """The gpu.* facts and step.idle_ms; returns the summary's "gpu" entry (empty without steps)."""
    t, put, windows, step_ms, launches = ctx.trace, ctx.put, ctx.windows, ctx.step_ms, ctx.launches
    ts, dur, corr = t.ts, t.dur, t.corr
    evs = sorted(ctx.gpu_events, key=ts.__getitem__)
    blocks: list[list[float]] = []  # [start, end, launch ts of the block's first event]
    for i in evs:
        s, e = ts[i], ts[i] + dur[i]
        if blocks and s <= blocks[-1][1]:
            if e > blocks[-1][1]:
                blocks[-1][1] = e
        else:
            r = launches.get(corr[i])
            blocks.append([s, e, t.ts[r] if r is not None else s])
    busy, host, gap, util = [], [], [], []
    starts = [b[0] for b in blocks]
    for (ws, we), sm in zip(windows, step_ms):
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
        util.append(b_ms / 1000 / sm if sm else 0.0)
    idle = [sm - b for sm, b in zip(step_ms, busy)]
    util_med, idle_med = median(util), median(idle)
    if util_med is None or idle_med is None:  # no steps
        return {}
    put("gpu.utilization", util_med, "ratio", "GPU busy (kernels, copies, memsets) / step")
    put("step.idle_ms", idle_med, "ms", "GPU idle per step")
    put("gpu.idle_host_wait_ms", median(host), "ms", "GPU idle while the next work was not launched yet")
    put("gpu.idle_gap_ms", median(gap), "ms", "GPU idle although the next work was already launched")
    tot_idle = sum(host) + sum(gap)
    return {"gpu": {"utilization": round(util_med, 4), "idle_ms": round(idle_med, 3),
                    "idle_host_wait_fraction": round(sum(host) / tot_idle, 4) if tot_idle else 0.0}}
