"""Compare current runs against a baseline: a verdict per metric and whether the gate fails.

Verdicts per metric: `regression`, `improvement`, `no-change` (the point within the threshold and
the interval ruling out a change of RESOLVE_FACTOR thresholds), `inconclusive` (the point estimate
crosses the threshold but the interval does not clear it, or the point lies within it but the interval
still reaches RESOLVE_FACTOR thresholds), `unstable` (the interval is wider than
the threshold, so a change of that size cannot be told from noise), and `not-comparable` (a
different environment: the numbers are shown, never judged).

Where either side's training thread waited for a CPU materially (`contended`: other processes
competed for its cores, MATERIAL_WAIT), the wall time is shown but the verdict rests on
contention-corrected evidence, each with its own interval: the step's wall time less the
training thread's wait for a CPU in it, and the script's CPU time per step (the training thread's
time on a CPU plus its DataLoader workers': perfdoctor's own threads are not the script's). A wall-time
regression that the extra wait explains (the corrected evidence shows no regression) is
`host-contention`: not decided, not passed, exit 0 (`strict` fails it); a regression of the
corrected evidence (more work, or more sleeping and I/O in the script) fails as a regression.
Where the current side's other CPUs were busier than the baseline's (`RunRecord.others_busy`), the
same work runs slower beside them (a co-runner on a sibling hyperthread, in the caches): a change of
the corrected evidence that this can explain (its interval's lower bound within the threshold times
1 + CO_RUNNER_SLOWDOWN x the difference) is `host-contention` too, and only what exceeds it fails.

A run of either side that lies far above its side's other runs even in its fastest steps, less its
wait for a CPU, was slowed as a whole by something outside the script that the guest cannot see (the
hypervisor, another VM's memory traffic): it is set aside with a note (`baseline.interfered_runs`:
three robust standard deviations and the threshold above the others' median, at most a third of a
side, never below three runs), as the fast steps inside a run are judged because contention only
adds time.

The gate as a whole is `failed`, `passed`, `undecided`, `host-contention` or `not-comparable`. It fails on a
regression, on a new finding at or above `fail_on`, and, when the step time stays undecided
(`unstable` or `inconclusive`), on a point estimate beyond twice the threshold (a large slowdown
never passes because the machine was noisy) or on anything undecided with `strict`. An undecided
gate that does not fail is `undecided`, never `passed`. `perfdoctor run --baseline` adds runs to
the current side while the step time is undecided (`Comparison.settled`, orchestrate.run_and_gate).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from perfdoctor.contracts.baseline import Environment, GateFinding, is_baseline
from perfdoctor.contracts.files import read_bytes
from perfdoctor.contracts.report import decode_report, is_report
from perfdoctor.contracts.run import rank_dirs
from perfdoctor.errors import InputError
from perfdoctor.gate import stats
from perfdoctor.gate.baseline import (
    COUNTERS,
    IDENTITY_KEYS,
    MIN_STEPS,
    Baseline,
    RunRecord,
    interfered_runs,
    load_baseline,
    record_from_report,
    record_from_run_dir,
    repeat_dirs,
    without_interfered,
)
from perfdoctor.gate.explain import Explanation, explain
from perfdoctor.model import SEVERITIES, at_or_above

SCHEMA = "perfdoctor/compare/v1"
COUNTER_SLACK = 0.5  # counts per step: counters are averages over the profiled steps
MEMORY_SLACK_BYTES = 32 * 2**20  # allocator and RSS granularity
# The step time's interval: a 90% two-sided interval, so each bound is a one-sided 95% bound
# (a regression is claimed when the lower bound clears the threshold: a one-sided test at 5%).
LEVEL = 0.90
UNDECIDED = ("unstable", "inconclusive")  # step-time verdicts the interval could not settle
POINT_FAIL_FACTOR = 2.0  # undecided, a point estimate beyond this many thresholds still fails
# The change a gate is built to tell from the threshold (+15 % at the default 10 %): `--save-baseline`
# records the runs that take (adaptive.baseline_resolves), and a step time is `no-change` only where its
# interval rules this change out; an interval that still reaches it is `inconclusive` and the gate adds runs
RESOLVE_FACTOR = 1.5
# A side waited for CPUs materially where a run's training thread spent this share of the threshold
# waiting for a CPU (of its steady steps' wall time): a wait that large can move the wall time's
# verdict by itself, so the verdict rests on the contention-corrected evidence instead.
MATERIAL_WAIT = 0.25
# The most a co-runner slows the same work, per CPU's worth of other processes' CPU time (in units of
# the other CPUs' capacity: RunRecord.others_busy): measured on this project's 2-vCPU VM, whose two
# vCPUs behave as SMT siblings of one core. One busy process on the other CPU made the steady script's
# CPU time per step 17 % longer, one sharing its own CPU 12 % (docs/busy-machine.md, "co-runner
# allowance", says how to measure it again on another machine). A physical bound, not fitted to a
# benchmark; `perfdoctor run/compare --co-runner-slowdown` overrides it.
CO_RUNNER_SLOWDOWN = 0.17
WORK_METRIC = "step time less CPU wait"
CPU_METRIC = "script CPU time per step"


@dataclass
class Row:
    metric: str
    unit: str
    baseline: float | None
    current: float | None
    change_pct: float | None
    ci_pct: tuple[float, float] | None  # LEVEL interval of the change, in percent
    verdict: str
    kind: str  # timing | wall (shown under contention, not judged) | cpu | throughput (derived from the first row) | memory | counter
    # how the verdict was reached: "interval" (the confidence interval against the threshold),
    # "point-estimate" (the point alone: a summary-only side, or an undecided interval whose point
    # lies beyond POINT_FAIL_FACTOR thresholds), "values" (memory and counters, by value and slack),
    # None where nothing was decided (unstable, inconclusive, not comparable)
    basis: str | None = None
    # the slowdown of the same work that a busier host explains on this row (`_contention_rows`)
    allowance: float = field(default=0.0, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "unit": self.unit, "baseline": _r(self.baseline), "current": _r(self.current),
                "change_pct": _r(self.change_pct, 2), "ci_pct": None if self.ci_pct is None else [round(v, 2) for v in self.ci_pct],
                "verdict": self.verdict, "kind": self.kind, "basis": self.basis}


@dataclass
class Comparison:
    failed: bool
    comparable: bool
    rows: list[Row]
    new_findings: list[GateFinding]
    resolved_findings: list[GateFinding]
    notes: list[str]
    env_differences: list[dict[str, Any]] = field(default_factory=list)
    max_regression: float = 0.10
    fail_on: str | None = None
    baseline_runs: int = 0
    current_runs: int = 0
    failing_findings: list[GateFinding] = field(default_factory=list)
    findings: list[GateFinding] = field(default_factory=list)  # every finding of the current side
    # the runs compared (baseline, current): their step times are what a chart of the comparison draws
    sides: tuple[list[RunRecord], list[RunRecord]] = field(default=([], []), repr=False)
    strict: bool = False  # an undecided step time fails
    # the step time's interval settled nothing (unstable or inconclusive), whatever then decided the gate
    undecided: bool = False
    # the gate failed on something more current runs cannot take back: a regression of peak memory
    # (the max over runs) or of a counter, or a new finding (the union over runs)
    failed_beyond_timing: bool = False
    # either side's training thread waited for a CPU materially: the timing verdict rests on the
    # contention-corrected rows (the wall time's row is shown beside them)
    contended: bool = False
    # the wall time grew beyond the threshold and the extra wait for a CPU explains it
    host_contention: bool = False
    _explanation: list[Explanation | None] = field(default_factory=list, repr=False)

    @property
    def explanation(self) -> Explanation | None:
        """Why the sides differ (gate.explain), worked out once, when first asked for: phases from the
        run folders, modules and operators from their traces; None without run folders on both sides."""
        if not self._explanation:
            self._explanation.append(explain(*self.sides, self.env_differences))
        return self._explanation[0]

    @property
    def verdict(self) -> str:
        if self.failed:
            return "failed"
        if not self.comparable:
            return "not-comparable"
        if self.host_contention:
            return "host-contention"
        return "undecided" if self.undecided else "passed"

    @property
    def settled(self) -> bool:
        """More runs of the current side cannot change the outcome, or need not: the environments
        differ, the step time's interval decided, or the gate failed on memory, a counter or a
        finding. `perfdoctor run --baseline` adds runs until this holds (or --max-repeats)."""
        return not self.comparable or not self.undecided or self.failed_beyond_timing

    def as_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "verdict": self.verdict, "failed": self.failed, "comparable": self.comparable,
                "undecided": self.undecided, "strict": self.strict,
                "max_regression": self.max_regression, "ci_level": LEVEL, "fail_on": self.fail_on,
                "baseline_runs": self.baseline_runs, "current_runs": self.current_runs,
                "contended": self.contended, "host_contention": self.host_contention,
                "rows": [r.as_dict() for r in self.rows], "new_findings": msgspec.to_builtins(self.new_findings),
                "failing_findings": msgspec.to_builtins(self.failing_findings),
                "resolved_findings": msgspec.to_builtins(self.resolved_findings),
                "findings": msgspec.to_builtins(self.findings),
                "env_differences": self.env_differences, "notes": self.notes,
                "explanation": None if self.explanation is None else self.explanation.as_dict()}


def _r(v: float | None, nd: int = 4) -> float | None:
    return None if v is None else round(v, nd)


def env_differences(base: Environment, cur: Environment, allow_different_args: bool = False
                    ) -> tuple[list[dict[str, Any]], list[str]]:
    """Identity keys that differ (these make timings not comparable) and softer notes. With
    `allow_different_args` (the user changed the script's arguments on purpose) differing arguments
    are a note, not a difference."""
    diffs = []
    notes = []
    for k in IDENTITY_KEYS:
        b, c = base.get(k), cur.get(k)
        if b is not None and c is not None and b != c:
            if k == "args" and allow_different_args:
                notes.append(f"the script's arguments differ, judged anyway (--allow-different-args): {b} (baseline) "
                             f"vs {c} (current)")
                continue
            diffs.append({"key": k, "baseline": b, "current": c})
    for k in ("python", "platform"):
        if base.get(k) and cur.get(k) and base[k] != cur[k]:
            notes.append(f"{k} differs: {base[k]} (baseline) vs {cur[k]} (current)")
    if base.get("script_sha256") and cur.get("script_sha256") and base["script_sha256"] != cur["script_sha256"]:
        notes.append("the script changed since the baseline was recorded (that change is what is being measured)")
    return diffs, notes


def timing_metric() -> str:
    return f"step time (p{round(stats.GATE_QUANTILE * 100)})"


def _timing_row(base: list[RunRecord], cur: list[RunRecord], t: float, between: tuple[float, int] | None,
                seed: int, notes: list[str]) -> Row:
    up, down = 1 + t, 1 / (1 + t)
    if not all(len(r.step_ms) >= MIN_STEPS for r in base + cur):
        # a summary-only side knows its median and nothing else: compare medians, by point only
        bm = [r.median_ms for r in base if r.median_ms]
        cm = [r.median_ms for r in cur if r.median_ms]
        if not bm or not cm:
            return Row("step time (median)", "ms", stats.side_center(bm) if bm else None,
                       stats.side_center(cm) if cm else None, None, None, "inconclusive", "timing")
        b0, c0 = stats.side_center(bm), stats.side_center(cm)
        point = c0 / b0
        notes.append("no per-step timings on one side: the median step time is compared by its point estimate "
                     "only, with no confidence interval (compare run folders or baselines for a verdict)")
        if point > up or point < down:
            return Row("step time (median)", "ms", b0, c0, (point - 1) * 100, None, "inconclusive", "timing")
        return Row("step time (median)", "ms", b0, c0, (point - 1) * 100, None, "no-change", "timing", "point-estimate")
    if between is None:
        notes.append("run-to-run noise is unknown (one run on each side): the interval covers the noise "
                     "within a run only; record the baseline with --repeats 3 for an honest interval")
    return _interval_row(timing_metric(), [r.step_ms for r in base], [r.step_ms for r in cur], t, between, seed,
                         notes)


def co_runner_allowance(base: list[RunRecord], cur: list[RunRecord], slowdown: float = CO_RUNNER_SLOWDOWN) -> float:
    """The slowdown of the same work that the current side's busier host explains: `slowdown` x how
    much busier its other CPUs were than the baseline's (the sides' means of `RunRecord.others_busy`);
    0 where the current side's were not busier or a run does not know it (today's behaviour)."""
    b = [r.others_busy for r in base]
    c = [r.others_busy for r in cur]
    if not b or not c or any(x is None for x in b + c):
        return 0.0
    return slowdown * max(statistics.fmean(x for x in c if x is not None) - statistics.fmean(x for x in b if x is not None),
                          0.0)


# The per-step work counters that tell whether both sides did the same operator work: the same
# operators per step on the same amount of numbers (within WORK_SLACK, or half a call) is the same work
WORK_COUNTERS = ("ops.calls_per_step", "kernels.launches_per_step", "compute.flops_per_step")
WORK_SLACK = 0.01


def work_changes(base: list[RunRecord], cur: list[RunRecord]) -> list[tuple[str, float, float]]:
    """The work counters (WORK_COUNTERS: operator calls, kernel launches, FLOPs per step, noise-free) whose
    sides' means differ, as (counter, baseline, current); empty where they agree or neither side
    counted them. They differ where the sides' ranges over their runs lie apart by more than the slack
    (a data-dependent program path varies from run to run on both sides alike). Where they agree the
    same operator work ran on both sides, so more CPU time beside busier CPUs may be the host's
    (`co_runner_allowance`); where they differ the program changed."""
    out = []
    for name in WORK_COUNTERS:
        b = [r.counters[name] for r in base if name in r.counters]
        c = [r.counters[name] for r in cur if name in r.counters]
        if len(b) != len(base) or len(c) != len(cur):
            continue
        bm, cm = statistics.fmean(b), statistics.fmean(c)
        slack = max(0.5, WORK_SLACK * bm)
        if min(c) - max(b) > slack or min(b) - max(c) > slack:
            out.append((name, bm, cm))
    return out


def _center(series: list[list[float]]) -> float:
    """A side's centre of a low quantile per run (stats.GATE_QUANTILE): what its row shows and judges."""
    return stats.side_center([stats.quantile(x, stats.GATE_QUANTILE) for x in series])


def _interval_row(metric: str, base: list[list[float]], cur: list[list[float]], t: float,
                  between: tuple[float, int] | None, seed: int, notes: list[str], kind: str = "timing",
                  allow: float = 0.0) -> Row:
    """A row judged by its interval: the ratio of the sides' centres of a low quantile per run
    (stats.ratio_interval) against the threshold. `base` and `cur` hold each run's per-step series.
    `allow`: the slowdown a busier host explains (`co_runner_allowance`): a lower bound above the
    threshold but within (1 + t) x (1 + allow) is `host-contention` where the point estimate lies
    within it too, `inconclusive` where it does not (more runs may decide)."""
    up, down = 1 + t, 1 / (1 + t)
    b0, c0 = _center(base), _center(cur)
    sigma_b2, df = between or (0.0, 0)
    point, lo, hi = stats.ratio_interval(base, cur, sigma_b2, df, seed=seed, level=LEVEL)
    halfwidth = math.sqrt(hi / lo) - 1
    if lo > up * (1 + allow):
        verdict = "regression"
    elif lo > up:
        verdict = "host-contention" if point <= up * (1 + allow) else "inconclusive"
    elif hi < down:
        verdict = "improvement"
    elif halfwidth > t:
        verdict = "unstable"
    elif point > up or point < down or hi > 1 + RESOLVE_FACTOR * t:
        verdict = "inconclusive"
    else:
        verdict = "no-change"
    if verdict == "unstable":
        notes.append(f"the {metric} is too noisy to judge a {t:.0%} change: its {LEVEL:.0%} interval spans "
                     f"{(lo - 1) * 100:+.1f}%..{(hi - 1) * 100:+.1f}%; use more steps or --repeats, or a quieter machine")
    return Row(metric, "ms", b0, c0, (point - 1) * 100, ((lo - 1) * 100, (hi - 1) * 100), verdict, kind,
               None if verdict in UNDECIDED else "interval", allow)


def contended(runs: list[RunRecord], t: float) -> bool:
    """Whether a run's training thread waited for a CPU materially (MATERIAL_WAIT of the threshold
    `t`, of its steady steps' wall time), every run's wait known and every run judged by its steps:
    then the contention-corrected series decide, not the wall time."""
    shares = [r.wait_share for r in runs]
    if not all(len(r.step_ms) >= MIN_STEPS for r in runs) or any(x is None for x in shares):
        return False
    return max(x for x in shares if x is not None) >= MATERIAL_WAIT * t


def deciding_series(runs: list[RunRecord], t: float) -> list[tuple[str, list[list[float]]]]:
    """The per-step series whose intervals decide a gate over `runs` (both sides' runs), by metric,
    each a list of the runs' series: the wall time; under contention (`contended`) the step time less
    the training thread's wait for a CPU, and the script's CPU time where every run measured it."""
    if not contended(runs, t):
        return [(timing_metric(), [r.step_ms for r in runs])]
    out = [(WORK_METRIC, [r.work_ms for r in runs])]
    if all(r.script_cpu_ms for r in runs):
        out.append((CPU_METRIC, [r.script_cpu_ms for r in runs]))
    return out


def _contention_rows(base: list[RunRecord], cur: list[RunRecord], t: float, seed: int,
                     notes: list[str], slowdown: float = CO_RUNNER_SLOWDOWN) -> tuple[Row, list[Row], bool] | None:
    """Where either side's training thread waited for a CPU materially (MATERIAL_WAIT), the wall
    time's row (shown, not judged), the contention-corrected rows the verdict rests on (the step
    time less the training thread's wait for a CPU; the script's CPU time per step, the training
    thread's plus its DataLoader workers', where every run measured it), whether the host explains a
    wall-time regression (the wall time grew beyond the threshold and no corrected row regressed or
    stays undecided: the extra wait explains it; or a corrected row grew within what the current
    side's busier other CPUs explain, `co_runner_allowance`, each row's share in `Row.allowance`, and
    none regressed). No allowance where the sides' work counters differ (`work_changes`). None where the wait is unknown on a run, or immaterial on all: the wall time decides."""
    runs = base + cur
    if not contended(runs, t):
        return None
    q = f" (p{round(stats.GATE_QUANTILE * 100)})"
    bw, cw = [r.step_ms for r in base], [r.step_ms for r in cur]
    # the wall time's row keeps its name (step time (p10)): shown first, as on a quiet host, not judged
    wall = _interval_row(timing_metric(), bw, cw, t, _sigma_b2(bw, cw, seed), seed, [], kind="wall")
    allow = co_runner_allowance(base, cur, slowdown)
    changed = work_changes(base, cur)
    if allow > 0 and changed:
        # the same work done slower is what the allowance explains; these sides did not run the same work
        notes.append("co-runners: the other CPUs were busier on the current side, but the work per step changed ("
                     + ", ".join(f"{n} {b:g} -> {c:g}" for n, b, c in changed) + "): more CPU time is the "
                     "script's, and no slowdown of the host is allowed for")
        allow = 0.0
    series = dict(deciding_series(runs, t))
    rows: dict[str, Row] = {}
    if CPU_METRIC in series:
        b, c = series[CPU_METRIC][:len(base)], series[CPU_METRIC][len(base):]
        rows[CPU_METRIC] = _interval_row(CPU_METRIC + q, b, c, t, _sigma_b2(b, c, seed), seed, notes, kind="cpu",
                                         allow=allow)
    b, c = series[WORK_METRIC][:len(base)], series[WORK_METRIC][len(base):]
    work_allow = allow
    if CPU_METRIC in rows:
        # the step less its wait is CPU time plus blocked time (sleeping, I/O, locks): busier CPUs slow the
        # first, not the second, so what they explain of it is what the CPU time surely grew (its
        # interval's lower bound; at most the allowance), in the share of the step that is CPU time
        cpu = rows[CPU_METRIC]
        grew = max(0.0, cpu.ci_pct[0] / 100 if cpu.ci_pct else 0.0)
        share = min(1.0, (cpu.baseline or 0.0) / _center(b))
        work_allow = min(allow, grew) * share
    rows[WORK_METRIC] = _interval_row(WORK_METRIC + q, b, c, t, _sigma_b2(b, c, seed), seed, notes, allow=work_allow)
    deciding = [rows[m] for m in (WORK_METRIC, CPU_METRIC) if m in rows]
    if len(deciding) < 2:
        notes.append("the script's CPU time per step was not measured on every run (a baseline recorded before "
                     "it was kept): the verdict rests on the step time less the training thread's wait for a CPU "
                     "alone")

    def side(rs: list[RunRecord]) -> str:
        wait = statistics.fmean(statistics.median(r.wait_ms) for r in rs)
        share = statistics.fmean(r.wait_share or 0.0 for r in rs)
        loads = [v for r in rs for v in r.loadavg]
        load = f", load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""
        return f"{wait:.1f} ms per step ({share:.0%} of the step{load})"

    notes.insert(0, f"contention: the training thread waited for a CPU {side(base)} on the baseline and {side(cur)} "
                    f"on the current side: other processes competed for these cores, so wall times are inflated; the "
                    f"verdict rests on the step time less that wait and on the script's CPU time per step, each with "
                    f"its own interval")
    if allow > 0:
        def busy(rs: list[RunRecord]) -> float:
            return statistics.fmean(r.others_busy or 0.0 for r in rs)
        notes.insert(1, f"co-runners: the other CPUs were busier on the current side ({busy(cur):.2f} of their "
                        f"capacity, {busy(base):.2f} on the baseline): beside them the same work runs up to "
                        f"{allow:.1%} slower ({slowdown:g} per busy CPU), so a corrected row is a regression only "
                        f"where its interval's lower bound clears "
                        + "; ".join(f"{(1 + t) * (1 + r.allowance) - 1:+.1%} ({r.metric})" for r in deciding)
                        + " (the step less its wait: the CPU time's share of it, at most what the CPU time surely grew)")
    corunner = [r for r in deciding if r.verdict == "host-contention"]
    if corunner and not any(r.verdict == "regression" for r in deciding):
        ci = "; ".join(f"the {r.metric} changed {r.change_pct or 0.0:+.1f}% ({LEVEL:.0%} interval "
                       f"{r.ci_pct[0]:+.1f}%..{r.ci_pct[1]:+.1f}%)" for r in corunner if r.ci_pct)
        explained = max(r.allowance for r in corunner)
        notes.insert(1, f"host contention: not decided. {ci[0].upper() + ci[1:]}, within the {explained:.1%} that the "
                        f"current side's busier other CPUs explain beyond the {t:.0%} threshold: the same work done "
                        f"slower beside other processes cannot be told from more work here. Neither passed nor "
                        f"failed: gate on a quieter runner, or record the baseline under the same load (or "
                        f"--strict to fail)")
    host = bool(corunner) or (wall.change_pct is not None and wall.change_pct > t * 100
                              and all(r.verdict in ("no-change", "improvement") for r in deciding))
    if host and not corunner:
        wall.verdict, wall.basis = "host-contention", None
        w = deciding[0]
        ci = f" ({LEVEL:.0%} interval {wall.ci_pct[0]:+.1f}%..{wall.ci_pct[1]:+.1f}%)" if wall.ci_pct else ""
        notes.insert(1, f"host contention: not decided. The step's wall time changed {wall.change_pct:+.1f}%{ci}, "
                        f"but the extra wait for a CPU explains it: less that wait the step changed "
                        f"{w.change_pct or 0.0:+.1f}%"
                        + (f", and the script's CPU time per step {deciding[1].change_pct or 0.0:+.1f}%"
                           if len(deciding) > 1 else "")
                        + ". Neither passed nor failed: gate on a quieter runner (or --strict to fail)")
    if wall.verdict == "regression" and not any(r.verdict == "regression" for r in deciding):
        wall.verdict, wall.basis = "host-contention", None  # the wall time alone is not judged under contention
    return wall, deciding, host


def _simple_row(metric: str, unit: str, kind: str, b: float | None, c: float | None, t: float, slack: float) -> Row | None:
    if b is None or c is None:
        return None
    change = None if b == 0 else (c / b - 1) * 100
    if c - b > max(slack, t * b):
        verdict = "regression"
    elif b - c > max(slack, t * b / (1 + t)):
        verdict = "improvement"
    else:
        verdict = "no-change"
    return Row(metric, unit, b, c, change, None, verdict, kind, "values")


def _sigma_b2(base: list[list[float]], cur: list[list[float]], seed: int) -> tuple[float, int] | None:
    """Between-run variance of a low quantile per run, pooled over the sides that have repeats (each
    run's per-step series), and its degrees of freedom (stats.pooled_between_log_var, which verify
    uses too)."""
    return stats.pooled_between_log_var([base, cur], seed, MIN_STEPS)


def _set_aside(runs: list[RunRecord], side: str, t: float, notes: list[str]) -> list[RunRecord]:
    """A side's runs less those something outside the script slowed as a whole (`interfered_runs`),
    each named in a note."""
    aside = interfered_runs(runs, t)
    for i, frac in aside:
        notes.append(f"interference: run {i + 1} of the {side}'s {len(runs)} was {frac:+.0%} slower than the "
                     f"others' median even in its fastest steps, less its wait for a CPU: something outside the "
                     f"script (another VM on the host, a neighbour's memory traffic) slowed the whole run; set aside")
    return without_interfered(runs, t, aside)


def compare(baseline: Baseline | list[RunRecord], current_records: list[RunRecord], max_regression: float = 0.10,
            fail_on: str | None = None, seed: int = 0, strict: bool = False,
            allow_different_args: bool = False, co_runner_slowdown: float = CO_RUNNER_SLOWDOWN) -> Comparison:
    """Judge `current_records` (one or more runs of the same command) against a baseline. An
    undecided step time fails when its point estimate lies beyond POINT_FAIL_FACTOR thresholds (times
    what the host's co-runners explain, `co_runner_allowance`), and fails whatever its estimate with
    `strict`. `allow_different_args`: see `env_differences`; `co_runner_slowdown`: CO_RUNNER_SLOWDOWN."""
    if not 0 <= co_runner_slowdown < 1:
        raise InputError(f"--co-runner-slowdown must be a fraction like 0.17, got {co_runner_slowdown!r}")
    if fail_on is not None and fail_on not in SEVERITIES:
        raise InputError(f"--fail-on must be one of high, medium, low (got {fail_on!r})")
    if not 0 < max_regression < 10:
        raise InputError(f"--max-regression must be a fraction like 0.10 (10%), got {max_regression!r}")
    base = baseline.records if isinstance(baseline, Baseline) else list(baseline)
    cur = list(current_records)
    if not base or not cur:
        raise InputError("nothing to compare: the baseline or the current side holds no runs")
    t = max_regression
    notes: list[str] = [n for r in base + cur for n in r.notes]
    made = len(base), len(cur)  # the runs each side made; those set aside are named in the notes
    base, cur = _set_aside(base, "baseline", t, notes), _set_aside(cur, "current side", t, notes)
    diffs, env_notes = env_differences(base[0].env, cur[0].env, allow_different_args)
    notes += env_notes
    comparable = not diffs
    rows: list[Row] = []
    evidence = _contention_rows(base, cur, t, seed, notes, co_runner_slowdown)
    contended = evidence is not None
    if evidence is None:
        timing = _timing_row(base, cur, t, _sigma_b2([r.step_ms for r in base], [r.step_ms for r in cur], seed),
                             seed, notes)
        deciding = [timing]
        host = False
    else:
        timing, deciding, host = evidence
    undecided = comparable and not host and any(r.verdict in UNDECIDED for r in deciding) and not any(
        r.verdict == "regression" for r in deciding)
    if undecided:
        for d in deciding:
            if d.verdict in UNDECIDED and d.change_pct is not None and (
                    1 + d.change_pct / 100 > (1 + POINT_FAIL_FACTOR * t) * (1 + d.allowance)):
                beyond = f" and the {d.allowance:.1%} the busier host explains" if d.allowance > 0 else ""
                notes.append(f"the {d.metric}'s interval could not settle a {t:.0%} threshold, but its estimate, "
                             f"{d.change_pct:+.1f}%, lies beyond {POINT_FAIL_FACTOR:g}x the threshold{beyond}: failed "
                             f"as a regression on the point estimate")
                d.verdict, d.basis = "regression", "point-estimate"
    rows.append(timing)
    rows += [r for r in deciding if r is not timing]
    # throughput is the step time seen the other way up: same evidence, same verdict
    if timing.baseline and timing.current:
        ci = None if timing.ci_pct is None else (100 / (1 + timing.ci_pct[1] / 100) - 100, 100 / (1 + timing.ci_pct[0] / 100) - 100)
        bt, ct = 1000 / timing.baseline, 1000 / timing.current
        rows.append(Row("throughput", "steps/s", bt, ct, (ct / bt - 1) * 100, ci, timing.verdict, "throughput", timing.basis))
        bs = [r.batch_size for r in base if r.batch_size]
        cs = [r.batch_size for r in cur if r.batch_size]
        if bs and cs:
            rows.append(Row("throughput", "samples/s", bt * bs[0], ct * cs[0], (ct * cs[0] / (bt * bs[0]) - 1) * 100,
                            None, timing.verdict, "throughput", timing.basis))
    bp = [r.peak_memory_bytes for r in base if r.peak_memory_bytes is not None]
    cp = [r.peak_memory_bytes for r in cur if r.peak_memory_bytes is not None]
    row = _simple_row("peak memory", "bytes", "memory", max(bp) if bp else None, max(cp) if cp else None, t, MEMORY_SLACK_BYTES)
    if row:
        rows.append(row)
    for name in sorted(set(base[0].counters) & set(cur[0].counters) & set(COUNTERS)):
        # each side's mean over its runs: a data-dependent program path counts differently from run to run
        bc = statistics.fmean(r.counters[name] for r in base if name in r.counters)
        cc = statistics.fmean(r.counters[name] for r in cur if name in r.counters)
        row = _simple_row(name, "count/step", "counter", bc, cc, t, COUNTER_SLACK)
        if row:
            rows.append(row)
    only = sorted((set(base[0].counters) ^ set(cur[0].counters)) & set(COUNTERS))
    if only:
        notes.append("counters measured on one side only (not compared): " + ", ".join(only))

    base_fps = {f.fingerprint for r in base for f in r.findings}
    cur_f: dict[str, GateFinding] = {}
    for r in cur:
        for f in r.findings:
            cur_f.setdefault(f.fingerprint, f)
    new = [f for fp, f in sorted(cur_f.items()) if fp not in base_fps]
    resolved = sorted({f.fingerprint: f for r in base for f in r.findings if f.fingerprint not in cur_f}.values(),
                      key=lambda f: f.fingerprint)
    failing = [f for f in new if fail_on is not None and at_or_above(f.severity, fail_on)]

    if not comparable:
        for row in rows:
            row.verdict, row.basis = "not-comparable", None
        notes.insert(0, "NOT COMPARABLE: the baseline was recorded in a different environment ("
                     + "; ".join(f"{d['key']}: {d['baseline']} vs {d['current']}" for d in diffs)
                     + "). Timings are shown but not judged; record a new baseline in this environment"
                     + ("; arguments changed on purpose: `perfdoctor compare --allow-different-args` judges the pair"
                        if any(d["key"] == "args" for d in diffs) else "") + ".")
    # under contention the wall time's row is shown, not judged: the corrected rows decide
    regressed = [r for r in rows if r.verdict == "regression" and r.kind not in ("throughput", "wall")]
    beyond_timing = bool(failing) or any(r.kind in ("memory", "counter") for r in regressed)
    host = host and comparable
    failed = bool(regressed) or bool(failing) or (strict and (undecided or host))
    if strict and undecided and any(r.verdict in UNDECIDED for r in deciding):
        notes.append("--strict: the step time is undecided, and an undecided gate fails")
    if strict and host and not regressed and not failing:
        notes.append("--strict: the step time grew with the host's contention, which decides nothing, and an "
                     "undecided gate fails")
    return Comparison(failed=failed, comparable=comparable, rows=rows, new_findings=new, resolved_findings=resolved,
                      notes=notes, env_differences=diffs, max_regression=t, fail_on=fail_on,
                      baseline_runs=made[0], current_runs=made[1], failing_findings=failing,
                      findings=[f for _, f in sorted(cur_f.items())], sides=(base, cur), strict=strict,
                      undecided=undecided, failed_beyond_timing=beyond_timing, contended=contended,
                      host_contention=host and not regressed)


def host_contention_sentence(c: Comparison) -> str:
    """Why a gate the host's contention explains is neither passed nor failed (its note)."""
    return next((n for n in c.notes if n.startswith("host contention: not decided")), "host contention: not decided")


def undecided_sentence(c: Comparison) -> str:
    """Why an undecided gate is not a pass, with the step time's interval, and what to do."""
    timing = next((r for r in c.rows if r.verdict in UNDECIDED and r.kind != "throughput"),
                  c.rows[0] if c.rows else None)
    change = timing.change_pct if timing is not None else None
    ci = timing.ci_pct if timing is not None else None
    what = "The step time could not be judged"
    if change is not None:
        what = f"The step time changed {change:+.1f}%"
        if ci:
            what += f" ({LEVEL:.0%} CI {ci[0]:+.1f}% … {ci[1]:+.1f}%)"
    return (f"Undecided, not passed: {what} after {c.current_runs} run(s) against {c.baseline_runs} "
            f"baseline run(s); the noise of this machine does not let a {c.max_regression:.0%} threshold be "
            f"settled either way. To decide: gate on a quieter runner, allow more runs (--max-repeats), record the "
            f"baseline again with more --repeats, or add --strict to fail undecided gates.")


def load_side(path: Path | str) -> Baseline | list[RunRecord]:
    """A baseline file, a run folder, a gate's --out-dir (its repeat-N run folders, every one a run
    of the side), or a report.json (inside a run folder: the whole run; alone: a summary-only
    record)."""
    path = Path(path)
    if path.is_dir():
        if (path / "meta.json").exists() or rank_dirs(path):  # a run folder, or a job folder of ranks
            return [record_from_run_dir(path)]
        repeats = repeat_dirs(path)
        if repeats:
            return [record_from_run_dir(d) for d in repeats]
        raise InputError(f"{path}: not a run folder (no meta.json, no repeat-N run folders); pass a baseline file, "
                         f"a run folder or its report.json")
    raw = read_bytes(path)
    if is_baseline(path, raw):
        return load_baseline(path)
    if is_report(path, raw):
        if (path.parent / "meta.json").exists() and (path.parent / "steps.json").exists():
            return [record_from_run_dir(path.parent)]
        return [record_from_report(decode_report(path, raw), str(path))]
    raise InputError(f"{path}: neither a perfdoctor baseline nor a perfdoctor report.json")


def compare_files(base_path: Path | str, current_path: Path | str, max_regression: float = 0.10,
                  fail_on: str | None = None, seed: int = 0, strict: bool = False,
                  allow_different_args: bool = False, co_runner_slowdown: float = CO_RUNNER_SLOWDOWN) -> Comparison:
    """`perfdoctor compare BASE CURRENT`: each side a baseline file, a run folder, a gate's
    --out-dir of repeat-N run folders, or a report.json."""
    base = load_side(base_path)
    cur = load_side(current_path)
    cur_records = cur.records if isinstance(cur, Baseline) else cur
    return compare(base, cur_records, max_regression=max_regression, fail_on=fail_on, seed=seed, strict=strict,
                   allow_different_args=allow_different_args, co_runner_slowdown=co_runner_slowdown)
