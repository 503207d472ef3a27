"""Statistics shared by the facts, the report and the gate, one definition each: quantiles and the
median, a duration as text, the step-time summary and breakdown, the steady-state steps of a run, and the CPUs the machine's
other processes kept busy during them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from perfdoctor.contracts.report import BreakdownDoc, StepSeriesDoc, StepTimeDoc


def quantile(xs: Sequence[float], q: float) -> float:
    """The q-quantile of xs, interpolated between order statistics (numpy's default, type 7)."""
    s = sorted(xs)
    if not s:
        raise ValueError("quantile of an empty series")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def median(xs: Sequence[float]) -> float | None:
    """The median of xs: the middle value, or the mean of the two middle ones (the 0.5 `quantile`);
    None for an empty series (nothing was measured)."""
    return float(statistics.median(xs)) if xs else None


def ms_text(v: object) -> str:
    """A duration (ms) as the reports and the notes write it: whole ms from 100, one decimal from 1,
    else µs (a wait of 0.2 ms is "205 µs", never "0 ms")."""
    if not isinstance(v, (int, float)):
        return "n/a"
    return f"{v:.0f} ms" if v >= 100 else f"{v:.1f} ms" if v >= 1 else f"{v * 1000:.0f} µs"


def step_time_summary(walls: list[float]) -> StepTimeDoc | None:
    """The report's step-time statistics of step times in ms: {"median", "p90", "mean", "min",
    "max", "n"}, times rounded to 4 digits (0.1 µs); None for no steps."""
    mid = median(walls)
    if mid is None:
        return None
    return StepTimeDoc(median=round(mid, 4), p90=round(quantile(walls, 0.9), 4), mean=round(statistics.fmean(walls), 4),
                       min=round(min(walls), 4), max=round(max(walls), 4), n=len(walls))


def breakdown(parts: dict[str, float], step: float) -> dict[str, float]:
    """Where the median step `step` goes, from the per-part medians `parts` (ms): the parts as
    measured, all scaled down by one factor where together they exceed the step (medians of
    parts need not add up to the median of their sums), then "other", the rest (never negative).
    The result adds up to `step`."""
    used = sum(parts.values())
    scale = step / used if used > step else 1.0
    split: dict[str, float] = {}
    rest = step
    for category, ms in parts.items():
        split[category] = ms * scale
        rest -= split[category]
    split["other"] = max(0.0, rest)
    return split


def breakdown_rows(split: dict[str, float], step: float) -> list[BreakdownDoc]:
    """The summary's breakdown: one {"category", "ms", "fraction"} row per part of `breakdown`
    (zero parts included), in its order, rounded to 4 digits."""
    return [BreakdownDoc(category, round(ms, 4), round(ms / step, 4) if step else 0.0) for category, ms in split.items()]


def warmup_steps(n_total: int) -> int:
    """Steps dropped at the start of a run: the first max(2, 10%) (allocator, autotuning, caches,
    lazy imports and the first DataLoader batches all land there)."""
    return max(2, math.ceil(0.10 * n_total))


def profiler_steps(window: dict | None) -> range:
    """The steps the profiler held: its warm-up and recorded steps and the step after them, which
    carries the profiler's stop and the trace export (empty where no step was profiled)."""
    window = window or {}
    last = window.get("last_step")
    return range(int(window.get("skip") or 0) + 1, int(last) + 2) if last is not None else range(0)


def steady_steps(steps: list[dict], window: dict | None, min_steps: int = 3) -> list[dict]:
    """Steady-state steps, the one definition the report summary and the gate share: the warm-up
    dropped (`warmup_steps`, and every step before the profiler's schedule begins), and the
    profiler's window dropped (its warm-up and recorded steps, whose timings the profiler and
    cProfile inflate, and the step after it, which carries the profiler's stop and the trace
    export). A short run falls back to fewer exclusions until `min_steps` remain."""
    drop = max(warmup_steps(len(steps)), int((window or {}).get("skip") or 0))
    held = profiler_steps(window)
    after = [s for s in steps if s["i"] > drop]
    outside = [s for s in after if s["i"] not in held]
    for cand in (outside, after, [s for s in steps if s["i"] > 1]):
        if len(cand) >= min_steps:
            return cand
    return steps


def step_series(ms: list[float], steady: list[int], window: list[int] | None) -> StepSeriesDoc:
    """The summary's `step_series`: each step's time in order (step i at index i - 1), the steady-state
    steps as [first, last] runs, and the profiler's window (its warm-up and recorded steps) or None."""
    runs: list[list[int]] = []
    for i in steady:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return StepSeriesDoc(ms=[round(v, 3) for v in ms], steady=runs, window=window)


def others_cpus(machine_ms: Sequence[float], tree_ms: Sequence[float], wall_ms: Sequence[float]) -> float | None:
    """The CPUs the machine's other processes kept busy over a run's steps: the CPU time every process
    on the machine used (/proc/stat, in clock ticks: noisy per step, so summed over the steps) less the
    script's process tree's, over the steps' wall time. 1.0: one CPU's worth of other work all along.
    None where a series is missing or the steps took no time."""
    if not wall_ms or len(machine_ms) != len(wall_ms) or len(tree_ms) != len(wall_ms) or sum(wall_ms) <= 0:
        return None
    return max(0.0, (sum(machine_ms) - sum(tree_ms)) / sum(wall_ms))
