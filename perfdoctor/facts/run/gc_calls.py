"""The gc.collect() probe's records (capture/probes/gc_calls.py) -> one `gc_collect` subject per line
calling gc.collect() inside the steps (PD027): its calls and time per steady step."""

from __future__ import annotations

import statistics

from perfdoctor.facts.model import site_subject
from perfdoctor.facts.run.context import RunContext


def add(ctx: RunContext) -> None:
    idx = {x["i"] for x in ctx.steady}
    if not idx:
        return
    for r in ctx.probes.gc_calls:
        per = {int(row[0]): (row[1], row[2] if len(row) > 2 else 1) for row in r.ms_by_step
               if len(row) >= 2 and int(row[0]) in idx}
        if not per:
            continue
        s = site_subject(ctx.facts, "gc_collect", r.site)
        if s is None:
            continue
        s.add("calls_per_step", sum(n for _, n in per.values()) / len(idx), "count",
              detail=f"steady steps with a call: {len(per)} of {len(idx)}")
        series = tuple(per.get(x["i"], (0.0, 0))[0] for x in ctx.steady)
        s.add("ms", statistics.fmean(series), "ms", detail=f"mean over {len(idx)} steady steps", per_step=series)
        s.add("ms_per_call", statistics.median(ms / n for ms, n in per.values() if n), "ms",
              detail="median over the steady steps with a call")
