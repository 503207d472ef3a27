"""The garbage-collection probe's records (capture/probes/gc_time.py) -> `gc.ms`, the mean time per
steady step in Python's garbage collections (0 on a step without one), and `gc.compute_ms`, the part
of it inside forward, backward and the optimizer step: a straggler's cause in the rank table."""

from __future__ import annotations

import statistics

from perfdoctor.facts.run.context import RunContext


def add(ctx: RunContext) -> None:
    rec, steady = ctx.probes.gc_time, ctx.steady
    if rec is None or not steady:
        return
    per = {int(row[0]): row for row in rec.ms_by_step if len(row) >= 4}
    series = tuple(float(per[int(x["i"])][1]) if int(x["i"]) in per else 0.0 for x in steady)
    inner = tuple(float(per[int(x["i"])][3]) if int(x["i"]) in per else 0.0 for x in steady)
    which = f"mean over {len(series)} steady steps, {sum(1 for v in series if v)} with a collection"
    ctx.facts.add("gc.ms", statistics.fmean(series), "ms", detail=which, per_step=series)
    ctx.facts.add("gc.compute_ms", statistics.fmean(inner), "ms", detail=which, per_step=inner)
