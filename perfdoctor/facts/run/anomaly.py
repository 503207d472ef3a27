"""The anomaly probe's records (capture/probes/anomaly.py) -> `autograd.anomaly_enabled` and one
`anomaly` subject per line that switched anomaly detection on, with the time anomaly mode spent
capturing Python stacks per steady step (`stack_ms`)."""

from __future__ import annotations

import statistics

from perfdoctor.facts.model import Subject, site_subject
from perfdoctor.facts.run.context import RunContext


def add(ctx: RunContext) -> None:
    for an in ctx.probes.anomaly:
        if an.enabled:
            ctx.facts.add("autograd.anomaly_enabled", True, detail="set_detect_anomaly/detect_anomaly seen")
            s = site_subject(ctx.facts, "anomaly", an.site)
            if s is not None:
                s.add("enabled", True)
                _stack_ms(ctx, s)


def _stack_ms(ctx: RunContext, s: Subject) -> None:
    """The mean over the steady steps the profiler did not hold, where there are any: a short run's
    steady steps include the profiler's window (stats.steady_steps), where the profiler and cProfile
    make every Python call, and a stack capture is nothing else, about 3x dearer (PD013's sample at
    --steps 16: 0.66-0.90 ms a step outside the window, 1.9-2.4 inside)."""
    per = {int(row[0]): row[1] for row in ctx.probes.anomaly_stack_ms if len(row) >= 2}
    if not per or not ctx.steady or "stack_ms" in s.facts:
        return
    steps = [x for x in ctx.steady if x["i"] not in ctx.held] or ctx.steady
    series = tuple(per.get(x["i"], 0.0) for x in steps)
    where = "steady steps" + ("" if len(steps) == len(ctx.steady) else " outside the profiler's window")
    s.add("stack_ms", statistics.fmean(series), "ms", detail=f"mean over {len(series)} {where}", per_step=series)
