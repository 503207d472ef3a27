"""Counters that do not depend on machine noise (the CI gate compares them tightly): top-level aten
ops and kernel launches per step."""

from __future__ import annotations

from collections import defaultdict

from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.facts.trace.intervals import count_in
from perfdoctor.stats import median
from perfdoctor.trace.model import CPU_OP, KERNEL


def add(ctx: TraceContext) -> None:
    """ops.calls_per_step and kernels.launches_per_step (a kernel counts in the step that launched it)."""
    t, windows, launches = ctx.trace, ctx.cpu_windows, ctx.launches
    ts, dur, name, corr = t.ts, t.dur, t.name, t.corr
    by_track: dict[int, list[int]] = defaultdict(list)
    for i in t.indices(CPU_OP):
        by_track[t.track[i]].append(i)
    kernels = [ts[r] if (r := launches.get(corr[i])) is not None else ts[i] for i in t.indices(KERNEL)]
    aten = t.names_where(lambda s: s.startswith("aten::"))
    top = []
    for lst in by_track.values():
        lst.sort(key=dur.__getitem__, reverse=True)  # by start, the longest first (two stable sorts)
        lst.sort(key=ts.__getitem__)
        end = float("-inf")
        for i in lst:
            if ts[i] >= end:
                end = ts[i] + dur[i]
                if name[i] in aten:
                    top.append(ts[i])
    if windows:
        ctx.put("ops.calls_per_step", median(count_in(top, windows)), "count", "top-level aten ops per step")
        if kernels:
            ctx.put("kernels.launches_per_step", median(count_in(kernels, windows)), "count")
