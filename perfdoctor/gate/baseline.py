"""Run records and baseline files.

A run record is what the gate keeps of one run: its steady-state step times, derived throughput,
peak memory, the noise-free counters, its findings and the environment identity. A baseline file
(`perfdoctor/baseline/v1`) is one or more records of repeated runs plus the noise floor measured
when it was recorded; it is JSON with sorted keys and one number per line, so it reads in a diff.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from perfdoctor import __version__
from perfdoctor.contracts.baseline import (
    BASELINE_SCHEMA,
    BaselineDoc,
    Environment,
    GateFinding,
    NoiseDoc,
    RunDoc,
    SummaryDoc,
    ToolDoc,
    read_baseline,
)
from perfdoctor.contracts.report import ReportDoc, read_report
from perfdoctor.contracts.report import SummaryDoc as ReportSummaryDoc
from perfdoctor.contracts.run import Meta, Probes, Steps, rank_dirs, read_meta
from perfdoctor.contracts.run import read as read_run_file
from perfdoctor.contracts.source import read_source
from perfdoctor.errors import InputError
from perfdoctor.gate import stats
from perfdoctor.stats import others_cpus, steady_steps, warmup_steps

MIN_STEPS = 6  # fewer steady steps than this give no interval (the block bootstrap needs a series)
# Counters from the trace that do not depend on machine noise; the gate compares them tightly.
COUNTERS = ("sync.count_per_step", "copies.h2d_per_step", "copies.h2d_pageable_per_step",
            "ops.calls_per_step", "kernels.launches_per_step")
# Kept beside them, not judged as rows: what tells the same work from more where the counts agree (a
# larger batch or layer runs the same operators on more numbers): gate.compare.work_changes
SIGNATURE = ("compute.flops_per_step",)
# Environment keys that must match for timings to be comparable at all.
IDENTITY_KEYS = ("torch", "device", "device_name", "device_count", "cpu_count", "cpu_model", "script", "args")


@dataclass
class RunRecord:
    source: str  # the run folder or file it came from
    env: Environment  # identity: torch, device, device_name, cpu_count, python, script, script_sha256, args
    step_ms: list[float]  # steady-state step times, in order (empty when only a summary was available)
    median_ms: float | None
    batch_size: float | None = None
    peak_memory_bytes: int | None = None
    counters: dict[str, float] = field(default_factory=dict)
    findings: list[GateFinding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warmup_dropped: int = 0
    # per steady step, aligned with step_ms (empty where the run could not measure them): the training
    # thread's wait for a CPU within the step (schedstat), and the script's CPU time: the training
    # thread's time on a CPU plus its DataLoader workers' (not the process's other threads: they hold
    # perfdoctor's own line sampler, whose CPU time is not the script's and varies from run to run)
    wait_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    loadavg: list[float] = field(default_factory=list)  # the host's 1-min load average at the run's start and end
    # how busy the machine's other CPUs were over the steady steps: the CPU time of every process on
    # the machine less the script's process tree's, over (the CPUs less one) x the steps' wall time
    # (`others_busy`); None where unknown (one CPU, an older run or baseline)
    others_busy: float | None = None

    @property
    def work_ms(self) -> list[float]:
        """The contention-corrected step times: each steady step's wall time less the training
        thread's wait for a CPU in it (empty where the wait is unknown)."""
        if len(self.wait_ms) != len(self.step_ms):
            return []
        return [max(w - x, 0.001 * w) for w, x in zip(self.step_ms, self.wait_ms)]

    @property
    def script_cpu_ms(self) -> list[float]:
        """The script's CPU time per steady step: the training thread's and its DataLoader workers'
        (empty where it is unknown)."""
        return list(self.cpu_ms) if len(self.cpu_ms) == len(self.step_ms) and all(v > 0 for v in self.cpu_ms) else []

    @property
    def wait_share(self) -> float | None:
        """The share of the steady steps' wall time the training thread spent waiting for a CPU."""
        if not self.step_ms or len(self.wait_ms) != len(self.step_ms):
            return None
        return sum(self.wait_ms) / sum(self.step_ms)

    @property
    def gate_ms(self) -> float | None:
        """The value the gate judges: a low quantile of the steady steps (stats.GATE_QUANTILE),
        or the median when only a summary is known."""
        if len(self.step_ms) >= MIN_STEPS:
            return stats.quantile(self.step_ms, stats.GATE_QUANTILE)
        return self.median_ms

    @property
    def steps_per_s(self) -> float | None:
        return 1000.0 / self.median_ms if self.median_ms else None

    @property
    def samples_per_s(self) -> float | None:
        sps = self.steps_per_s
        return sps * self.batch_size if sps and self.batch_size else None

    def to_doc(self) -> RunDoc:
        return RunDoc(source=self.source, env=self.env, median_ms=_r(self.median_ms), steps_per_s=_r(self.steps_per_s),
                      samples_per_s=_r(self.samples_per_s), batch_size=self.batch_size,
                      peak_memory_bytes=self.peak_memory_bytes, counters=self.counters, findings=self.findings,
                      notes=self.notes, warmup_dropped=self.warmup_dropped,
                      step_ms=[round(v, 4) for v in self.step_ms], wait_ms=[round(v, 4) for v in self.wait_ms],
                      script_cpu_ms=[round(v, 4) for v in self.cpu_ms], loadavg=list(self.loadavg),
                      others_busy=_r(self.others_busy))

    @classmethod
    def from_doc(cls, d: RunDoc) -> RunRecord:
        return cls(source=d.source, env=dict(d.env), step_ms=list(d.step_ms), median_ms=d.median_ms,
                   batch_size=d.batch_size, peak_memory_bytes=d.peak_memory_bytes, counters=dict(d.counters),
                   findings=list(d.findings), notes=list(d.notes), warmup_dropped=d.warmup_dropped,
                   # a baseline recorded before they were kept has none: its runs are judged on wall time (and
                   # one that kept the process tree's CPU time, `cpu_ms`, before the script's: on the step less
                   # its wait alone)
                   wait_ms=list(d.wait_ms) if len(d.wait_ms) == len(d.step_ms) else [],
                   cpu_ms=list(d.script_cpu_ms) if len(d.script_cpu_ms) == len(d.step_ms) else [],
                   loadavg=list(d.loadavg), others_busy=d.others_busy)


def _r(v: float | None, nd: int = 4) -> float | None:
    return None if v is None else round(v, nd)


def _sha256(path: str | None) -> str | None:
    sf = read_source(path) if path else None  # the script the run names: a regular file, capped
    return hashlib.sha256(sf.data).hexdigest() if sf is not None else None


def _script_args(argv: list[str], script: str | None) -> list[str]:
    """The script's own arguments: argv without its first element when that is the script."""
    if argv and script and Path(argv[0]).name == Path(script).name:
        return list(argv[1:])
    return list(argv)


def _batch_size(report: ReportDoc) -> float | None:
    for name in ("run.batch_size", "dataloader.batch_size"):
        v = report.fact(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return float(v)
    return None


def _findings(report: ReportDoc) -> list[GateFinding]:
    out = []
    for f in report.findings:
        loc = f.locations[0] if f.locations else None
        out.append(GateFinding(rule=f.rule, fingerprint=f.identity(), severity=f.severity, title=f.title,
                               file=loc.file if loc else "", line=loc.line if loc else 0, code=loc.code if loc else ""))
    return out


def _counters(report: ReportDoc) -> dict[str, float]:
    out = {}
    for name in COUNTERS + SIGNATURE:
        v = report.fact(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = float(v)
    return out


def _peak(report: ReportDoc) -> int | None:
    v = report.fact("memory.peak_bytes")
    return int(v) if isinstance(v, (int, float)) else None


def _median(report: ReportDoc) -> float | None:
    st = report.summary.step_time_ms
    return float(st.median) if st is not None and st.median else None


def _identity(env: dict[str, Any], script: str | None, argv: list[str] | None, sha: str | None) -> Environment:
    return {"torch": env.get("torch"), "device": env.get("device"), "device_name": env.get("device_name"),
            "device_count": env.get("device_count"), "cpu_count": env.get("cpu_count"),
            "cpu_model": env.get("cpu_model"), "python": env.get("python"), "platform": env.get("platform"),
            "script": Path(script).name if script else None, "script_sha256": sha,
            "args": None if argv is None else _script_args(argv, script)}  # None: unknown, not checked


def meta_and_steps(run_dir: Path) -> tuple[Meta, list[dict[str, Any]]]:
    """meta.json and the steps of a run folder; of a job folder (rank-<R> run folders, a distributed
    job), rank 0's meta and the job's steps: step i is the slowest rank's step i (a synchronous step
    ends when its slowest rank's does), over the steps every rank recorded."""
    dirs = [d for _, d in rank_dirs(run_dir)] if not (run_dir / "meta.json").exists() else [run_dir]
    metas = [read_meta(d) for d in dirs] or [read_meta(run_dir)]  # no rank folder: the usual error
    per_rank = []
    for d in dirs:
        run_steps = read_run_file(d / "steps.json", Steps)
        per_rank.append({s.i: msgspec.to_builtins(s) for s in run_steps.steps} if run_steps is not None else {})
    common = sorted(set.intersection(*(set(r) for r in per_rank))) if per_rank else []
    steps = [max((r[i] for r in per_rank), key=lambda s: s.get("wall_ms") or 0) for i in common]
    return metas[0], steps


def record_from_run_dir(run_dir: Path | str) -> RunRecord:
    """A run record from a run folder (meta.json, steps.json, report.json), or from a job folder of
    rank run folders (its merged report.json; `meta_and_steps`)."""
    run_dir = Path(run_dir)
    meta, steps = meta_and_steps(run_dir)
    window: dict[str, Any] | None = msgspec.to_builtins(meta.window) if meta.window is not None else None
    report = read_report(run_dir / "report.json") if (run_dir / "report.json").exists() else ReportDoc(
        schema="", summary=ReportSummaryDoc(), findings=[])
    notes: list[str] = []
    timed = [s for s in steps if s.get("wall_ms") is not None]
    # a step of 0 ms (a clock too coarse to see it) has no place in the log-scale statistics
    kept = [s for s in steady_steps(timed, window, min_steps=MIN_STEPS) if s["wall_ms"] > 0]
    steady = [float(s["wall_ms"]) for s in kept]
    drop = warmup_steps(len(timed))
    if timed and len(steady) != len(steady_steps(timed, window, min_steps=0)):
        notes.append(f"{run_dir.name}: too few steady-state steps outside the profiler window and warm-up; "
                     f"the gate used {len(steady)} steps that include some of them. "
                     f"Run more steps (--steps) for a cleaner gate.")
    median = statistics.median(steady) if steady else None
    if median is None:
        median = _median(report)
        notes.append(f"{run_dir.name}: no per-step timings; only the report's median step time is known")
    mems = [int(s["mem_bytes"]) for s in steps if s.get("mem_bytes") is not None]
    peak = _peak(report)
    peak = peak if peak is not None else (max(mems) if mems else None)
    script = meta.script or meta.module
    sha = _sha256(meta.script)
    contention = _contention(run_dir, [int(s["i"]) for s in kept], steady, meta.env.cpu_count)
    return RunRecord(source=str(run_dir), env=_identity(msgspec.to_builtins(meta.env), script, list(meta.argv), sha),
                     step_ms=steady, median_ms=median, batch_size=_batch_size(report), peak_memory_bytes=peak,
                     counters=_counters(report), findings=_findings(report), notes=notes, warmup_dropped=drop,
                     **contention)


def _contention(run_dir: Path, steps: list[int], wall_ms: list[float], cpus: int | None) -> dict[str, Any]:
    """RunRecord's contention fields on each of `steps` (probes.json's cpu_wait; `wall_ms` their wall
    times, `cpus` the run's usable CPUs): the training thread's wait for a CPU, the script's CPU time
    (the training thread's time on a CPU plus its DataLoader workers'), the host's 1-min load average
    at the run's start and end, and how busy the other CPUs were (`others_busy`); none where the run
    did not measure them (no schedstat, a job folder of ranks, an older run)."""
    probes = read_run_file(run_dir / "probes.json", Probes) if (run_dir / "meta.json").exists() else None
    w = probes.cpu_wait if probes is not None else None
    if w is None or not steps or max(steps) > len(w.wait_ms):
        return {}

    def at(xs: list[Any]) -> list[Any]:
        return [xs[i - 1] for i in steps] if len(xs) == len(w.wait_ms) else []

    run, workers = at(w.run_ms), at(w.workers_run_ms)
    cpu = [a + b for a, b in zip(run, workers)] if run and len(workers) == len(run) else []
    return {"wait_ms": at(w.wait_ms), "cpu_ms": cpu,
            "loadavg": [w.loadavg[0], w.loadavg_end[0]] if w.loadavg and w.loadavg_end else [],
            "others_busy": others_busy(at(w.machine_ms), at(w.whole_tree_ms()), wall_ms, cpus)}


def others_busy(machine_ms: list[float], tree_ms: list[float], wall_ms: list[float], cpus: int | None) -> float | None:
    """How busy the machine's other CPUs were over a run's steps: the CPUs its other processes kept
    busy (`stats.others_cpus`) over (`cpus` - 1). 1: one CPU's worth of other work per other CPU; above
    1 (at most cpus / (cpus - 1)) the others also ran on the script's own CPU while it waited. `cpus` is
    the run's usable CPUs: where its affinity leaves some of the machine's out, their work counts too.
    None with one CPU or where a series is missing."""
    others = others_cpus(machine_ms, tree_ms, wall_ms)
    if not cpus or cpus < 2 or others is None:
        return None
    return min(others / (cpus - 1), cpus / (cpus - 1))


REPEAT_PREFIX = "repeat-"  # `perfdoctor run --out-dir DIR` with several runs writes DIR/repeat-1, repeat-2, ...


def repeat_dir(out_dir: Path, n: int) -> Path:
    """The run folder of the n-th run (1-based) of a repeated `perfdoctor run --out-dir out_dir`."""
    return out_dir / f"{REPEAT_PREFIX}{n}"


def repeat_dirs(folder: Path | str) -> list[Path]:
    """The run folders repeat-1..repeat-N inside a repeated run's --out-dir, in run order (by N,
    not by name: repeat-10 comes after repeat-9); empty when the folder holds none."""
    folder = Path(folder)
    found = []
    for d in folder.iterdir() if folder.is_dir() else ():
        n = d.name[len(REPEAT_PREFIX):]
        if d.name.startswith(REPEAT_PREFIX) and n.isdigit() and (d / "meta.json").is_file():
            found.append((int(n), d))
    return [d for _, d in sorted(found)]


def record_from_report(report: ReportDoc, source: str = "") -> RunRecord:
    """A summary-only record from a report.json with no run folder around it: the median step
    time, counters, findings and environment, but no per-step series (so no confidence interval).
    A report knows the run's torch and device (its name), not the rest of the machine."""
    run = report.run
    env = {"torch": run.torch, "device": run.device}
    script = run.script if isinstance(run.script, str) else None  # a trace's report names no script
    argv = run.argv if isinstance(run.argv, list) else None
    return RunRecord(source=source, env=_identity(env, script, argv, None),
                     step_ms=[], median_ms=_median(report), batch_size=_batch_size(report),
                     peak_memory_bytes=_peak(report), counters=_counters(report), findings=_findings(report),
                     notes=[f"{source or 'report'}: summary only (no per-step timings)"])


def noise_floor(records: list[RunRecord], seed: int = 0) -> NoiseDoc:
    """The noise measured at record time, of the value the gate judges (`statistic`: a low
    quantile of each run's steady steps); relative, as log-scale standard deviations ~ fractions.

    - within_run_rel_se: standard error of one run's value, from a circular block bootstrap of its
      steady-state steps (block length from the autocorrelation; steps within a run are
      correlated, so an i.i.d. bootstrap would understate it). Mean over runs.
    - between_run_rel_sd: run-to-run standard deviation of the run values beyond the within-run
      error (needs two or more runs; null with one).
    - spread: (max - min) / median of the run values.
    - single_run_halfwidth: 95% half-width, as a fraction, of one future run's value around the
      truth; a change smaller than about this cannot be told from noise with one run per side.
    """
    rng = random.Random(seed)
    vals = [r.gate_ms for r in records if r.gate_ms]
    within = [stats.within_run_log_var(r.step_ms, rng) for r in records]
    known = [v for v in within if v is not None]
    w = sum(known) / len(known) if known else None
    b = stats.between_run_log_var(vals, within)
    total = (w or 0.0) + (b or 0.0)
    return NoiseDoc(
        runs=len(records),
        statistic=f"p{round(stats.GATE_QUANTILE * 100)} of the steady-state steps",
        run_values_ms=[round(m, 4) for m in vals],
        within_run_rel_se=None if w is None else round(math.sqrt(w), 6),
        between_run_rel_sd=None if b is None else round(math.sqrt(b), 6),
        spread=round((max(vals) - min(vals)) / statistics.median(vals), 6) if len(vals) > 1 else None,
        single_run_halfwidth=round(math.exp(stats.Z95 * math.sqrt(total)) - 1, 6) if (w is not None or b is not None) else None,
        block_lengths=[stats.block_length(r.step_ms) if len(r.step_ms) >= MIN_STEPS else None for r in records],
        method="a low quantile per run; circular block bootstrap within runs (block length from "
               "autocorrelation); between-run variance of log run values less the within-run part",
    )


@dataclass
class Baseline:
    records: list[RunRecord]
    noise: NoiseDoc
    created: str = ""
    source: str = ""

    @property
    def env(self) -> Environment:
        return self.records[0].env if self.records else {}


def baseline_doc(records: list[RunRecord], seed: int = 0) -> BaselineDoc:
    if not records:
        raise InputError("no runs to make a baseline from")
    meds = [r.median_ms for r in records if r.median_ms]
    fps: dict[str, GateFinding] = {}
    for r in records:
        for f in r.findings:
            fps.setdefault(f.fingerprint, f)
    peaks = [r.peak_memory_bytes for r in records if r.peak_memory_bytes is not None]
    return BaselineDoc(
        schema=BASELINE_SCHEMA,
        tool=ToolDoc(name="perfdoctor", version=__version__),
        created=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        environment=records[0].env,
        summary=SummaryDoc(step_time_ms=round(statistics.median(meds), 4) if meds else None,
                           steps_per_s=round(1000 / statistics.median(meds), 4) if meds else None,
                           peak_memory_bytes=max(peaks) if peaks else None,
                           counters=records[0].counters),
        noise=noise_floor(records, seed),
        findings=sorted(fps.values(), key=lambda f: f.fingerprint),
        runs=[r.to_doc() for r in records],
    )


# A run is set aside as interfered with (`interfered_runs`) where its judged value lies this many robust
# standard deviations (1.4826 x the median absolute deviation: the Hampel identifier) above the median of
# its side's other runs, and beyond the gate's threshold too
INTERFERENCE_MADS = 3.0


def _run_value(r: RunRecord) -> float | None:
    """What a run is judged by for interference: the low quantile (stats.GATE_QUANTILE) of its steps less
    the training thread's wait for a CPU where that is known (the wait is already taken out), else of its
    wall times; None for a run too short to judge by its steps."""
    series = r.work_ms or r.step_ms
    return stats.quantile(series, stats.GATE_QUANTILE) if len(series) >= MIN_STEPS else None


def interfered_runs(records: list[RunRecord], max_regression: float) -> list[tuple[int, float]]:
    """(0-based index, fraction above the others' median) of the runs of one side that something outside
    the script slowed as a whole: a run whose value (`_run_value`: its fast steps, less its wait for a CPU)
    lies more than INTERFERENCE_MADS robust standard deviations above the median of the side's other
    runs, and more than `max_regression` above it. Inside a run the gate judges the fast steps because
    contention only ever adds time; a whole run slowed beyond its siblings is the same at the run's
    scale (the hypervisor lending this VM's cores to other guests, a neighbour on the host's memory:
    nothing the guest's wait for a CPU shows; seen on this project's VM as runs 27-37 % slower in CPU
    time too, docs/busy-machine.md, "sixth round"). Never faster runs (interference does not speed a
    run up), only with three other runs or more to take a median and a spread from, at most a third of
    the side, and none where that would leave fewer than three."""
    vals = [_run_value(r) for r in records]
    if len(records) < 4 or any(v is None or v <= 0 for v in vals):
        return []
    logs = [math.log(v) for v in vals if v is not None]
    out = []
    for i, x in enumerate(logs):
        others = logs[:i] + logs[i + 1:]
        m = statistics.median(others)
        spread = 1.4826 * statistics.median(abs(o - m) for o in others)
        if x - m > max(math.log(1 + max_regression), INTERFERENCE_MADS * spread):
            out.append((i, math.exp(x - m) - 1))
    if len(out) > len(records) // 3 or len(records) - len(out) < 3:
        return []
    return out


def without_interfered(records: list[RunRecord], max_regression: float,
                       aside: list[tuple[int, float]] | None = None) -> list[RunRecord]:
    """`records` less the runs `interfered_runs` sets aside (`aside`, where the caller has them already)."""
    skip = {i for i, _ in (interfered_runs(records, max_regression) if aside is None else aside)}
    return [r for i, r in enumerate(records) if i not in skip]


def save_baseline(records: list[RunRecord], path: Path | str, seed: int = 0) -> BaselineDoc:
    """Write a baseline file (sorted keys, indent 2: one number per line, readable in a diff)."""
    doc = baseline_doc(records, seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(msgspec.to_builtins(doc), sort_keys=True, indent=2) + "\n", encoding="utf-8")
    return doc


def load_baseline(path: Path | str) -> Baseline:
    path = Path(path)
    doc = read_baseline(path)
    return Baseline(records=[RunRecord.from_doc(r) for r in doc.runs], noise=doc.noise, created=doc.created,
                    source=str(path))
