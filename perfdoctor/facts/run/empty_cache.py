"""The empty_cache probe's records (capture/probes/empty_cache.py) -> one `empty_cache` subject per
calling line: its calls, and per step of the loop."""

from __future__ import annotations

from perfdoctor.facts.model import site_subject
from perfdoctor.facts.run.context import RunContext


def add(ctx: RunContext) -> None:
    n_loop = max(1, len(ctx.run_steps) - 1)
    for ec in ctx.probes.empty_cache:
        s = site_subject(ctx.facts, "empty_cache", ec.site)
        if s is not None:
            s.add("calls_per_step", ec.calls_in_steps / n_loop, "count")
            s.add("in_loop", ec.calls_in_steps > 0)
            s.add("calls", ec.calls, "count")
