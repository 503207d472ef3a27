"""steps.json and meta.json's window -> `run.*` (steps observed and profiled, the step clock, the
world size), the step time (`step.time_ms`, `step.time_p90_ms`) and its breakdown (`step.*_ms`), and
the report's summary of them (perfdoctor.stats: one definition for runs, traces and the gate)."""

from __future__ import annotations

from typing import Any

from perfdoctor.facts.run.context import RunContext, span
from perfdoctor.stats import breakdown, breakdown_rows, quantile, step_series, step_time_summary

LOSS_SCAN_STEPS = 30  # capture looks for retained losses on the first steps only (capture/recorder.py)
CATEGORIES = (("data loading", "data_ms"), ("forward", "forward_ms"), ("backward", "backward_ms"),
              ("optimizer", "optimizer_ms"))


def add(ctx: RunContext) -> None:
    facts, n, clock = ctx.facts, len(ctx.run_steps), ctx.clock
    facts.add("run.steps_observed", n, "count")
    facts.add("run.steps_profiled", ctx.profiled, "count")
    facts.add("run.step_clock", clock)
    if ctx.rank is not None:
        facts.add("run.world_size", ctx.rank.world_size, "count", detail=f"this is rank {ctx.rank.rank}")
    if n >= 3:  # the probes looked for retained losses on these steps (PD006 trusts them)
        facts.add("run.loss_scan_steps", min(n, LOSS_SCAN_STEPS), "count")
    summary = ctx.summary
    summary.steps_observed, summary.steps_profiled, summary.step_clock = n, ctx.profiled, clock
    steady, median = ctx.steady, ctx.median
    walls = [s["wall_ms"] for s in steady]
    if median is not None:
        summary.step_time_ms = step_time_summary(walls)
        summary.steady_steps = [steady[0]["i"], steady[-1]["i"]]
        which = f"{len(walls)} steady-state steps ({span([x['i'] for x in steady])}, unprofiled)"
        facts.add("step.time_p90_ms", quantile(walls, 0.9), "ms", detail=f"p90 of {which}")
        split = composition(steady, median)
        summary.breakdown = breakdown_rows(split, median)
        facts.add("step.time_ms", median, "ms", detail=f"median of {which}", per_step=tuple(walls))
        for cat, k in CATEGORIES:
            facts.add(f"step.{k}", split[cat], "ms", detail=f"mean share of {which} x the median step",
                      per_step=tuple(_part(s, k) for s in steady))
        facts.add("step.other_ms", split["other"], "ms",
                  detail=f"step time not in data, forward, backward, optimizer; {which}")
    held = ctx.held
    if ctx.run_steps:  # every step of the run, for the charts: which were steady, which the profiler held
        summary.step_series = step_series([s.wall_ms for s in ctx.run_steps], [s["i"] for s in steady],
                                             [held.start, held.stop - 2] if held else None)


def _part(step: dict[str, Any], key: str) -> float:
    """A step's time in one part (ms), never more than the step."""
    return min(step.get(key) or 0.0, step["wall_ms"])


def composition(steady: list[dict[str, Any]], median: float) -> dict[str, float]:
    """Where the median step goes: each part's mean share of the steady steps (every step's parts
    as shares of its own time, scaled down where a step's parts exceed it), times the median step;
    "other" is the rest. Shares add up step by step, so the parts add up to the median step and
    "other" is only the time no part measured, also when a part is bimodal (a loader that delivers
    every few steps: per-part medians miss it and do not add up). Each step weighs the same, so a
    single slow step (a checkpoint, a collection) moves the shares by 1/n at most."""
    shares = dict.fromkeys((cat for cat, _ in CATEGORIES), 0.0)
    n = 0
    for s in steady:
        wall = s["wall_ms"]
        if wall <= 0:
            continue
        parts = {cat: _part(s, k) / wall for cat, k in CATEGORIES}
        scale = min(1.0, 1.0 / (sum(parts.values()) or 1.0))
        for cat, v in parts.items():
            shares[cat] += v * scale
        n += 1
    return breakdown({cat: median * v / n if n else 0.0 for cat, v in shares.items()}, median)
