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

Looking again after each added run is optional stopping, which raises a fixed-level test's false
positive rate; here a run is only added while the interval straddles the threshold, and the
interval at each look is a one-sided 95% bound against a threshold that identical code sits well
inside, so the few extra looks cost little (benchmarks/gate_reliability.py measures it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from perfdoctor.gate.baseline import Baseline, RunRecord
from perfdoctor.gate.compare import LEVEL, UNDECIDED, Comparison, compare

DEFAULT_MAX_REPEATS = 8  # runs of the current side at most, initial ones included


@dataclass
class GateRuns:
    """The current side's runs and the last comparison (None when a run failed: nothing judged)."""

    records: list[RunRecord]
    comparison: Comparison | None
    added: int = 0  # runs added beyond the initial repeats because the step time was undecided


def gate_runs(baseline: Baseline | list[RunRecord], next_run: Callable[[int], RunRecord | None], *, repeats: int,
              max_repeats: int = DEFAULT_MAX_REPEATS, max_regression: float = 0.10, fail_on: str | None = None,
              strict: bool = False, seed: int = 0) -> GateRuns:
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
            comparison = compare(baseline, records, max_regression, fail_on, seed=seed, strict=strict)
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
