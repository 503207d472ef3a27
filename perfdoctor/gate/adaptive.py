"""Adaptive repeats: gate against a baseline, adding runs of the current side while the step time
is undecided.

A gate's unit of evidence is a run. After the first `repeats` runs the comparison may be
`unstable` or `inconclusive`: on a machine shared with other jobs the interval is too wide to
settle the threshold. Then one more run of the current side is added and everything is judged
again, until the verdict is settled (`Comparison.settled`) or `max_repeats` runs were made. Runs
are added on the current side only: the baseline is a file recorded earlier, from code that is no
longer checked out, so its side is fixed (more baseline runs would need a new `--save-baseline`).
Every look judges all runs so far; a slowdown that stays undecided after the last one still fails
when its point estimate lies beyond twice the threshold (compare.POINT_FAIL_FACTOR), and fails
whatever its size with `strict`.

The baseline's side is fixed once written, so it is made wide enough when it is recorded
(`baseline_resolves`): `perfdoctor run --save-baseline` records `repeats` runs and, where they
disagree (on a busy machine the same work runs at a different speed from one run to the next),
adds runs up to `max_repeats` until a gate against it could tell a change of RESOLVE_FACTOR
thresholds from the threshold. The interval of a ratio of two sides' centres is at least about
t x sd x sqrt(1/n_baseline + 1/n_current) wide: a baseline of 3 runs caps it however many current
runs the gate adds.

Looking again after each added run is optional stopping, which raises a fixed-level test's false
positive rate; here a run is only added while the interval straddles the threshold, and the
interval at each look is a one-sided 95% bound against a threshold that identical code sits well
inside, so the few extra looks cost little (benchmarks/gate_reliability.py measures it).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from perfdoctor.gate import stats
from perfdoctor.gate.baseline import MIN_STEPS, Baseline, RunRecord, without_interfered
from perfdoctor.gate.compare import CO_RUNNER_SLOWDOWN, LEVEL, RESOLVE_FACTOR, UNDECIDED, Comparison, compare, deciding_series

DEFAULT_MAX_REPEATS = 8  # runs of the current side at most, initial ones included
# A baseline is wide enough when a gate against it, with DEFAULT_MAX_REPEATS current runs that vary
# as its own runs do, would find a change of compare.RESOLVE_FACTOR thresholds (+15 % at the default
# 10 %) a regression: the lower bound of that gate's interval clears the threshold.


def baseline_resolves(records: list[RunRecord], max_regression: float = 0.10,
                      current_runs: int = DEFAULT_MAX_REPEATS, seed: int = 0) -> bool:
    """Whether a gate against these baseline runs could tell a change of RESOLVE_FACTOR thresholds
    from the threshold on a series that may decide it (compare.deciding_series; either one
    regressing fails a gate, and more work shows in both): the lower bound of the gate's interval,
    for a current side of `current_runs` runs that vary as the baseline's do, clears the threshold.
    (Beside sustained load the step less its wait for a CPU is too noisy within each run for any
    number of runs to settle 1.5 thresholds, and the script's CPU time is not; a change in sleeping
    alone shows only in the former, which then must be larger to be decided.) The interval is the gate's model in closed form (each run's
    value varies by the between-run variance plus its own within-run variance, stats; a t quantile
    for the degrees of freedom both sides would give), not its bootstrap: a few hundred resamples
    per run, not thousands. Runs a gate would set aside as interfered with are left out here too. True
    with fewer than two runs (nothing disagrees) or where a run is too short to judge by its steps."""
    t = max_regression
    records = without_interfered(records, t)  # as the gate sets them aside (compare.compare)
    if len(records) < 2 or not all(len(r.step_ms) >= MIN_STEPS for r in records):
        return True
    rng = random.Random(seed)
    n = len(records)
    tq = t_quantile(1 - (1 - LEVEL) / 2, n - 1 + current_runs - 1)
    for _, runs in deciding_series(records, t):
        within = [stats.within_run_log_var(r, rng, 500) for r in runs]
        between = stats.between_run_log_var([stats.quantile(r, stats.GATE_QUANTILE) for r in runs], within)
        known = [v for v in within if v is not None]
        if between is None or not known:
            return True
        halfwidth = tq * math.sqrt((between + statistics.fmean(known)) * (1 / n + 1 / current_runs))
        if math.log(1 + RESOLVE_FACTOR * t) - halfwidth > math.log(1 + t):
            return True
    return False


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (p > 0.5) for `df` degrees of freedom: the normal quantile's Cornish-Fisher
    expansion (within 0.01 of the exact value from 3 degrees of freedom up)."""
    z = statistics.NormalDist().inv_cdf(p)
    v = max(1, df)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3))


@dataclass
class GateRuns:
    """The current side's runs and the last comparison (None when a run failed: nothing judged)."""

    records: list[RunRecord]
    comparison: Comparison | None
    added: int = 0  # runs added beyond the initial repeats because the step time was undecided


def gate_runs(baseline: Baseline | list[RunRecord], next_run: Callable[[int], RunRecord | None], *, repeats: int,
              max_repeats: int = DEFAULT_MAX_REPEATS, max_regression: float = 0.10, fail_on: str | None = None,
              strict: bool = False, seed: int = 0, co_runner_slowdown: float = CO_RUNNER_SLOWDOWN) -> GateRuns:
    """Run the current side `repeats` times (`next_run(n)`, n from 1, returns the n-th run's record,
    or None when that run failed and nothing may be judged), compare, and while the comparison is
    not settled add one run at a time up to `max_repeats` runs in all (at least `repeats`)."""
    most = max(repeats, max_repeats)
    records: list[RunRecord] = []
    comparison: Comparison | None = None
    while len(records) < most:
        if comparison is not None and comparison.settled:
            break
        record = next_run(len(records) + 1)
        if record is None:
            return GateRuns(records, None, max(0, len(records) - repeats))
        records.append(record)
        if len(records) >= repeats:
            comparison = compare(baseline, records, max_regression, fail_on, seed=seed, strict=strict,
                                 co_runner_slowdown=co_runner_slowdown)
    assert comparison is not None  # repeats >= 1
    added = len(records) - repeats
    if added:
        comparison.notes.append(
            f"the step time was undecided after {repeats} run(s): the gate added {added} run(s) of the current "
            f"side ({len(records)} in all; the baseline's runs are fixed)")
    if not comparison.settled:
        timing = next((r for r in comparison.rows if r.verdict in UNDECIDED), comparison.rows[0])
        ci = (f"; its {LEVEL:.0%} interval spans {timing.ci_pct[0]:+.1f}%..{timing.ci_pct[1]:+.1f}%"
              if timing.ci_pct else "")
        comparison.notes.append(
            f"still undecided after {len(records)} run(s) (--max-repeats {most}): the step time changed "
            f"{timing.change_pct:+.1f}%{ci}, against a threshold of {max_regression:.0%}"
            if timing.change_pct is not None else f"still undecided after {len(records)} run(s) (--max-repeats {most})")
    return GateRuns(records, comparison, added)
