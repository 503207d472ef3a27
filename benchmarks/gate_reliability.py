"""How reliable is the CI gate? False failures on identical code, detections of a 15% slowdown.

    python benchmarks/gate_reliability.py [--mode cli|library|simulate|all] [--trials 10]

- cli: the real CLI. Records a baseline of benchmarks/steady_train.py
  (`perfdoctor run SCRIPT --steps N --save-baseline B --repeats R0`), then `--trials` gate runs of
  the same code (`--baseline B --repeats R --max-repeats M`, adding runs while undecided; exit 1
  is a false failure) and `--trials` gate runs with PERFDOCTOR_BENCH_DELAY_FRACTION=`--slowdown`
  (exit 1 is a detection), taken in turn (same, slow, same, slow, ...) so that the host's drift
  over the minutes the benchmark takes falls on both alike. Prints each trial's verdict, measured
  change, runs used and time. `--rebaseline` records a fresh baseline before each trial, so that
  a host whose load swings over tens of minutes (a machine shared with other jobs) does not turn
  the benchmark into a measure of that drift.
- library: the same scenario without the CLI: the script runs bare and writes its own per-step
  times; the gate library builds the records and compares them.
- simulate: synthetic autocorrelated series (log-normal AR(1) within a run, plus a run offset)
  whose parameters are measured from bare runs of the steady script on this machine; many trials,
  each gated as `perfdoctor run --baseline` gates (runs added while undecided, up to --max-repeats).
- contention: a CI runner's neighbours (issue 20). Records a pool of real `perfdoctor run` folders
  of the steady script for each load (quiet: nothing added; sustained: one busy process per core
  for the whole run; bursty: the co-tenant below) and each change (unchanged code, +`--slowdown` CPU
  work per step, +`--slowdown` sleep per step), in rounds that visit every pool in turn (the host's
  drift falls on all alike) until `--pool-runs` rounds or `--minutes` are spent. Then, per cell
  (load x change x a baseline recorded quiet or under the same load), `--trials` gates as
  `perfdoctor run --save-baseline` and `--baseline` make them (the baseline: `--baseline-repeats` runs,
  more while they disagree, up to `--baseline-max-repeats`; the current side: `--repeats`, then runs
  added while undecided, up to `--max-repeats`: gate.adaptive), each drawing its baseline's and its current side's runs from
  the pools at random without reuse inside a gate: with pools smaller than the gates need, gates
  share runs and are not independent (the output says how many runs each pool held). Prints false
  failures, detections, undecided and host-contention verdicts per cell, with the load averages.
  `--keep DIR` keeps the run folders (traces removed); `--pools DIR[,DIR...]` judges kept ones again
  (pools merged over the folders); `--cells` judges some cells only (each cell draws with its own seed,
  so cells judged apart, in parallel, give what one process gives).
`--load bursty` runs the benchmark beside a co-tenant: random bursts of 0-2 busy processes
(CPU loops and memory copies, 0.3-4 s each), as other jobs on a shared CI machine would be;
`--load sustained`: one busy process per core for the whole benchmark.
Prints the counts and the time taken. Target: 0 false failures, >= 9 of 10 detections.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfdoctor.gate import RunRecord, compare, warmup_steps  # noqa: E402
from perfdoctor.gate import stats as gate_stats  # noqa: E402
from perfdoctor.gate.adaptive import baseline_resolves, gate_runs  # noqa: E402
from perfdoctor.gate.baseline import record_from_run_dir  # noqa: E402

gate_compare = sys.modules["perfdoctor.gate.compare"]  # the module (the package exports its compare())

SCRIPT = ROOT / "benchmarks" / "steady_train.py"
ENV_ID = {"torch": "bench", "device": "cpu", "cpu_count": os.cpu_count(), "script": "steady_train.py", "args": []}


def bare_run(steps: int, delay: float) -> list[float]:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "steps.json"
        env = dict(os.environ, PERFDOCTOR_BENCH_STEPS=str(steps), PERFDOCTOR_BENCH_DELAY_FRACTION=str(delay),
                   PERFDOCTOR_BENCH_OUT=str(out))
        subprocess.run([sys.executable, str(SCRIPT)], env=env, check=True)
        return json.loads(out.read_text())["step_ms"]


def record(series: list[float]) -> RunRecord:
    steady = series[warmup_steps(len(series)):]
    return RunRecord("bare", dict(ENV_ID), steady, statistics.median(steady))


def tally(name: str, same: list[str], slow: list[str], t0: float, slowdown: float) -> None:
    ff = sum(v == "FAIL" for v in same)
    det = sum(v == "FAIL" for v in slow)
    print(f"[{name}] identical code: {ff}/{len(same)} false failures   verdicts: {same}")
    print(f"[{name}] {slowdown:.0%} slower:     {det}/{len(slow)} detections       verdicts: {slow}")
    print(f"[{name}] time: {time.time() - t0:.0f} s")


def verdict(c) -> str:
    return "FAIL" if c.failed else c.rows[0].verdict


def mode_library(a) -> list[list[float]]:
    t0 = time.time()
    base_series = [bare_run(a.steps, 0.0) for _ in range(a.baseline_repeats)]
    base = [record(s) for s in base_series]
    same, slow, all_series = [], [], list(base_series)
    for i in range(a.trials):
        cs = [bare_run(a.steps, 0.0) for _ in range(a.repeats)]
        ss = [bare_run(a.steps, a.slowdown) for _ in range(a.repeats)]
        all_series += cs
        same.append(verdict(compare(base, [record(s) for s in cs], a.threshold, seed=i)))
        slow.append(verdict(compare(base, [record(s) for s in ss], a.threshold, seed=i)))
    tally("library, real runs", same, slow, t0, a.slowdown)
    return all_series


def fit_noise(series: list[list[float]]) -> tuple[float, float, float, float]:
    """Per run: AR(1) coefficient and sd of log step times; between runs: sd of log medians
    beyond the within-run part. Returns (phi, rel_sd, run_sd, mean_ms)."""
    phis, sds, meds = [], [], []
    for s in series:
        x = [math.log(v) for v in s[warmup_steps(len(s)):]]
        m = statistics.fmean(x)
        d = [v - m for v in x]
        var = sum(v * v for v in d)
        phis.append(sum(d[i] * d[i + 1] for i in range(len(d) - 1)) / var if var else 0.0)
        sds.append(statistics.pstdev(x))
        meds.append(statistics.median(x))
    phi, sd = statistics.fmean(phis), statistics.fmean(sds)
    n = len(series[0]) - warmup_steps(len(series[0]))
    within = (1.2533 * sd) ** 2 / n * (1 + phi) / (1 - phi) if phi < 1 else sd ** 2  # var of a median of AR(1)
    run_sd = math.sqrt(max(0.0, statistics.variance(meds) - within)) if len(meds) > 1 else 0.0
    return phi, sd, run_sd, math.exp(statistics.fmean(meds))


def mode_simulate(a, series: list[list[float]] | None) -> None:
    t0 = time.time()
    if not series:
        series = [bare_run(a.steps, 0.0) for _ in range(max(4, a.baseline_repeats + 1))]
    phi, sd, run_sd, mean = fit_noise(series)
    print(f"[simulate] measured noise from {len(series)} bare runs: AR(1) phi={phi:.2f}, within-run sd={sd:.1%}, "
          f"run-to-run sd={run_sd:.1%}, median step {mean:.1f} ms")
    rng = random.Random(0)

    def synth(m: float) -> RunRecord:
        off, e, out = rng.gauss(0, run_sd), 0.0, []
        innov = sd * math.sqrt(max(0.0, 1 - phi * phi))
        for _ in range(a.steps):
            e = phi * e + rng.gauss(0, innov)
            out.append(m * math.exp(off + e))
        return record(out)

    same: list[str] = []
    slow: list[str] = []
    used: dict[str, list[int]] = {"same": [], "slow": []}
    for i in range(a.sim_trials):
        base = [synth(mean) for _ in range(a.baseline_repeats)]
        for m, out, key in ((mean, same, "same"), (mean * (1 + a.slowdown), slow, "slow")):
            # the gate as `perfdoctor run --baseline` runs it: runs added while undecided (gate.adaptive)
            g = gate_runs(base, lambda n, m=m: synth(m), repeats=a.repeats, max_repeats=a.max_repeats,
                          max_regression=a.threshold, seed=i)
            assert g.comparison is not None
            c = g.comparison
            out.append("FAIL" if c.failed else ("undecided" if c.verdict == "undecided" else c.rows[0].verdict))
            used[key].append(c.current_runs)
    count = lambda v: {k: v.count(k) for k in sorted(set(v))}  # noqa: E731
    print(f"[simulate] {a.sim_trials} trials each: identical {count(same)}; {a.slowdown:.0%} slower {count(slow)}")
    print(f"[simulate] runs per gate (max {a.max_repeats}): identical mean {statistics.fmean(used['same']):.1f}, "
          f"slower mean {statistics.fmean(used['slow']):.1f}")
    print(f"[simulate] false failures {same.count('FAIL')}/{a.sim_trials}, detections {slow.count('FAIL')}/{a.sim_trials}; "
          f"time {time.time() - t0:.0f} s")


def _burn(kind: str, seconds: float) -> None:
    end = time.time() + seconds
    buf = bytearray(64 << 20) if kind == "mem" else None
    x = 0
    while time.time() < end:
        if buf is not None:
            bytes(buf)  # a 64 MiB copy: memory bandwidth and cache pressure
        else:
            x += 1


def _bursty_load(stop, seed: int) -> None:
    """Random bursts of 0-2 busy processes until `stop` is set (runs in a thread)."""
    import multiprocessing as mp
    rng = random.Random(seed)
    while not stop.is_set():
        seconds = rng.uniform(0.3, 4.0)
        procs = [mp.Process(target=_burn, args=(rng.choice(["cpu", "mem"]), seconds), daemon=True)
                 for _ in range(rng.choice([0, 0, 1, 1, 1, 2]))]
        for p in procs:
            p.start()
        stop.wait(seconds)
        for p in procs:
            p.join()


class Load:
    """A co-tenant for the duration of a `with` block: none ("quiet"), one busy process per core
    ("sustained"), or random bursts ("bursty")."""

    def __init__(self, kind: str, seed: int = 0):
        self.kind, self.seed = kind, seed
        self.stop = threading.Event()
        self.procs: list = []

    def __enter__(self) -> Load:
        import multiprocessing as mp
        if self.kind == "sustained":
            self.procs = [mp.Process(target=_burn, args=("cpu", 3600.0), daemon=True) for _ in range(os.cpu_count() or 1)]
            for p in self.procs:
                p.start()
        elif self.kind == "bursty":
            self.thread = threading.Thread(target=_bursty_load, args=(self.stop, self.seed), daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for p in self.procs:
            p.terminate()
            p.join()
        if self.kind == "bursty":
            self.thread.join()


CHANGES = {"same": {}, "work": {"PERFDOCTOR_BENCH_WORK_FRACTION": None}, "sleep": {"PERFDOCTOR_BENCH_DELAY_FRACTION": None}}


def record_pools(a, root: Path) -> None:
    """Rounds of `perfdoctor run` folders, one per (load, change) pool each round, into root/LOAD-CHANGE-N."""
    cli = [sys.executable, "-m", "perfdoctor", "run", str(SCRIPT), "--steps", str(a.steps), "--format", "json", "--overwrite"]
    t0 = time.time()
    for n in range(1, a.pool_runs + 1):
        for load in ("quiet", "sustained", "bursty"):
            for change, env_keys in CHANGES.items():
                if time.time() - t0 > a.minutes * 60:
                    print(f"[contention] time budget spent after {n - 1} full round(s)", flush=True)
                    return
                env = dict(os.environ, PERFDOCTOR_BENCH_STEPS="100000",
                           **{k: str(a.slowdown) for k in env_keys})
                out = root / f"{load}-{change}-{n}"
                with Load(load, seed=n):
                    p = subprocess.run(cli + ["--out-dir", str(out)], env=env, cwd=ROOT, capture_output=True, text=True)
                for big in ("trace.json.gz", "profile.pstats"):
                    (out / big).unlink(missing_ok=True)
                print(f"[contention] round {n} {load}/{change}: exit {p.returncode}, load average "
                      f"{os.getloadavg()[0]:.2f}" + (f": {p.stderr.strip()[-300:]}" if p.returncode else ""), flush=True)


def mode_contention(a) -> None:
    t0 = time.time()
    gate_compare.COUNTER_SLACK = math.inf  # counter rows never fail a gate here: only the timing verdict counts
    with tempfile.TemporaryDirectory() as d:
        roots = [Path(p) for p in a.pools.split(",")] if a.pools else [Path(a.keep or d)]
        if not a.pools:
            roots[0].mkdir(parents=True, exist_ok=True)
            record_pools(a, roots[0])
        pools: dict[tuple[str, str], list[RunRecord]] = {}
        loads: dict[str, list[float]] = {}
        for run in sorted(r for root in roots for r in root.iterdir()):
            load, change, _ = run.name.rsplit("-", 2)
            try:
                r = record_from_run_dir(run)
            except Exception as e:  # noqa: BLE001 - a run that failed is counted out, and said
                print(f"[contention] {run.name}: not judged ({e})")
                continue
            # the step time's verdict is what is measured: the extra work's own operator calls (a counter)
            # and memory would fail a gate by themselves, so they are not judged here (COUNTER_SLACK below);
            # the work counters stay, as the gate reads them to tell the same work from more
            # (gate.compare.work_changes)
            r.counters = {k: v for k, v in r.counters.items() if k in gate_compare.WORK_COUNTERS}
            r.findings, r.peak_memory_bytes = [], None
            pools.setdefault((load, change), []).append(r)
            loads.setdefault(load, []).extend(r.loadavg)
        print("[contention] runs per pool: " + ", ".join(f"{k[0]}/{k[1]} {len(v)}" for k, v in sorted(pools.items())))
        for load, xs in sorted(loads.items()):
            if xs:
                print(f"[contention] {load}: 1-min load average over its runs {min(xs):.2f}..{max(xs):.2f} "
                      f"(median {statistics.median(xs):.2f})")
        cells = set(a.cells.split(",")) if a.cells else None
        for load in ("quiet", "sustained", "bursty"):
            for base_load in (("quiet",) if load == "quiet" else ("quiet", load)):
                base_pool = pools.get((base_load, "same"), [])
                for change in CHANGES:
                    cell = f"{load}/{base_load}/{change}"
                    if cells is not None and cell not in cells:
                        continue
                    rng = random.Random(cell)  # each cell's draws are its own: cells can be judged apart
                    cur_pool = pools.get((load, change), [])
                    verdicts: list[str] = []
                    runs_used: list[int] = []
                    base_used: list[int] = []
                    for trial in range(a.trials):
                        order = rng.sample(range(len(base_pool)), len(base_pool))
                        base = [base_pool[i] for i in order[:a.baseline_repeats]]
                        # as `--save-baseline` records it: runs added while they disagree too much for a gate
                        # to decide (gate.adaptive.baseline_resolves), while the pools leave a current side
                        while (len(base) < min(a.baseline_max_repeats, len(order))
                               and sum(all(r is not b for b in base) for r in cur_pool) > a.repeats
                               and not baseline_resolves(base, a.threshold, a.max_repeats)):
                            base.append(base_pool[order[len(base)]])
                        left = [r for r in cur_pool if all(r is not b for b in base)]
                        if len(base) < a.baseline_repeats or len(left) < a.repeats:
                            break
                        draw = rng.sample(left, len(left))
                        g = gate_runs(base, lambda k, draw=draw: draw[k - 1] if k <= len(draw) else None,
                                      repeats=a.repeats, max_repeats=min(a.max_repeats, len(draw)),
                                      max_regression=a.threshold, seed=trial)
                        c = g.comparison
                        verdicts.append("?" if c is None else "FAIL" if c.failed else c.verdict)
                        runs_used.append(len(g.records))
                        base_used.append(len(base))
                    count = {k: verdicts.count(k) for k in sorted(set(verdicts))}
                    used = (f", {statistics.fmean(base_used):.1f} baseline and {statistics.fmean(runs_used):.1f} "
                            f"current runs per gate" if runs_used else "")
                    print(f"[contention] load {load:9s} baseline {base_load:9s} {change:5s}: {len(verdicts)} gates "
                          f"(pools {len(base_pool)}/{len(cur_pool)} runs{used}): {count}", flush=True)
    print(f"[contention] time {time.time() - t0:.0f} s")


def mode_cli(a) -> bool:
    cli = [sys.executable, "-m", "perfdoctor"]
    help_text = subprocess.run(cli + ["run", "--help"], capture_output=True, text=True, cwd=ROOT)
    if "--save-baseline" not in help_text.stdout:
        print("[cli] `perfdoctor run --save-baseline` is not available yet: skipped")
        return False
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        base = Path(d) / "baseline.json"
        env0 = dict(os.environ, PERFDOCTOR_BENCH_DELAY_FRACTION="0", PERFDOCTOR_BENCH_STEPS="100000")
        common = ["run", str(SCRIPT), "--steps", str(a.steps), "--out-dir", str(Path(d) / "runs"), "--overwrite",
                  "--format", "json"]
        def record_baseline() -> bool:
            for attempt in range(1, a.baseline_attempts + 1):
                # as the README tells a user: a baseline with a run far slower than the others (another job
                # held the machine through it; `--save-baseline` warns) is recorded again
                p = subprocess.run(cli + common + ["--save-baseline", str(base), "--repeats", str(a.baseline_repeats)],
                                   env=env0, cwd=ROOT, capture_output=True, text=True)
                if p.returncode != 0 or not base.exists():
                    print(f"[cli] recording the baseline failed (exit {p.returncode})")
                    return False
                noise = json.loads(base.read_text())["noise"]
                warned = "warning: run" in p.stderr
                print(f"[cli] baseline attempt {attempt}: p10 per run (ms) {noise['run_values_ms']}, between-run sd "
                      f"{noise['between_run_rel_sd']}{' (a slow outlier run: recorded again)' if warned else ''}", flush=True)
                if not warned:
                    break
            return True

        if not record_baseline():
            return False
        gate = ["--baseline", str(base), "--repeats", str(a.repeats), "--max-regression", f"{a.threshold:.0%}",
                "--max-repeats", str(a.max_repeats)] + (["--strict"] if a.strict else [])
        same, slow = [], []
        changes: dict[float, list[str]] = {0.0: [], a.slowdown: []}
        for trial in range(a.trials):
            if a.rebaseline and trial and not record_baseline():
                return False
            for delay, out in ((0.0, same), (a.slowdown, slow)):
                env = dict(env0, PERFDOCTOR_BENCH_DELAY_FRACTION=str(delay))
                t1 = time.time()
                p = subprocess.run(cli + common + gate, env=env, cwd=ROOT, capture_output=True, text=True)
                out.append({0: "pass", 1: "FAIL"}.get(p.returncode, f"exit {p.returncode}"))
                try:
                    g = json.loads(p.stdout)["gate"]
                    row = g["rows"][0]
                    how = " by point" if row.get("basis") == "point-estimate" else ""
                    changes[delay].append(f"{row['change_pct']:+.1f}% ({g['current_runs']} runs, {time.time() - t1:.0f} s)")
                    if out[-1] == "FAIL":
                        out[-1] = "FAIL" + how
                    elif g["verdict"] == "undecided":
                        out[-1] = f"undecided/{row['verdict']}"
                    else:
                        out[-1] = row["verdict"]
                    why = [f"{r['metric']} {r['change_pct']:+.1f}%" for r in g["rows"][1:]
                           if r["verdict"] == "regression" and r["kind"] != "throughput"]
                    why += [f"new finding {f.get('rule_id') or f.get('rule')}" for f in g.get("failing_findings") or []]
                    print(f"[cli] trial, delay {delay:.0%}: {out[-1]}, {changes[delay][-1]}"
                          + (f" (also: {', '.join(why)})" if why else ""), flush=True)
                except (ValueError, KeyError, IndexError, TypeError):
                    changes[delay].append("?")
                    print(f"[cli] trial, delay {delay:.0%}: {out[-1]}: {p.stderr.strip()[-300:]}", flush=True)
        tally("cli", [v.split(" ")[0] for v in same], [v.split(" ")[0] for v in slow], t0, a.slowdown)
        print(f"[cli] verdicts, identical: {same}")
        print(f"[cli] verdicts, {a.slowdown:.0%} slower: {slow}")
        print(f"[cli] measured change, identical: {'; '.join(changes[0.0])}")
        print(f"[cli] measured change, {a.slowdown:.0%} slower: {'; '.join(changes[a.slowdown])}")
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("cli", "library", "simulate", "contention", "all"), default="all")
    p.add_argument("--pool-runs", type=int, default=12, help="contention: rounds of runs (one per pool each)")
    p.add_argument("--minutes", type=float, default=60, help="contention: stop recording rounds after this long")
    p.add_argument("--keep", help="contention: keep the run folders here")
    p.add_argument("--pools", help="contention: judge the run folders kept here (by --keep; several: comma-separated) "
                   "instead of recording")
    p.add_argument("--cells", help="contention: judge only these cells, comma-separated LOAD/BASELINE-LOAD/CHANGE "
                   "(quiet/quiet/work, sustained/sustained/same, ...)")
    p.add_argument("--n-boot", type=int, default=0,
                   help="bootstrap replicates per interval (default: the gate's own, gate.stats.N_BOOT); fewer judge faster")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--baseline-repeats", type=int, default=3)
    p.add_argument("--baseline-max-repeats", type=int, default=8,
                   help="contention: add baseline runs while they disagree (as --save-baseline does) up to this many; "
                        "3 draws fixed baselines of 3 runs, as before")
    p.add_argument("--repeats", type=int, default=3, help="runs per comparison on the current side")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--sim-trials", type=int, default=100)
    p.add_argument("--threshold", type=float, default=0.10)
    p.add_argument("--slowdown", type=float, default=0.15, help="per-step delay of the slowed runs, a fraction")
    p.add_argument("--max-repeats", type=int, default=8, help="cli: the gate's --max-repeats (adaptive runs)")
    p.add_argument("--rebaseline", action="store_true",
                   help="cli: record a fresh baseline before each trial (a pair of gates), as a CI job that records "
                        "the base branch beside the change would; on a host whose load drifts over minutes")
    p.add_argument("--baseline-attempts", type=int, default=3,
                   help="cli: record the baseline again while --save-baseline warns of a slow outlier run, at most this often")
    p.add_argument("--strict", action="store_true", help="cli: gate with --strict (an undecided gate fails)")
    p.add_argument("--load", choices=("none", "bursty", "sustained"), default="none",
                   help="bursty: run beside random bursts of 0-2 busy processes (a shared CI machine); sustained: "
                        "one busy process per core throughout")
    a = p.parse_args()
    if a.n_boot:
        gate_stats.N_BOOT = a.n_boot
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; steps {a.steps}, "
          f"baseline {a.baseline_repeats} run(s), {a.repeats} run(s) per gate, threshold {a.threshold:.0%}, load {a.load}")
    try:
        if a.mode == "contention":
            mode_contention(a)
            return
        with Load({"none": "quiet"}.get(a.load, a.load)):
            if a.mode in ("cli", "all"):
                mode_cli(a)
            series = mode_library(a) if a.mode in ("library", "all") else None
            if a.mode in ("simulate", "all"):
                mode_simulate(a, series)
    finally:
        print(f"load average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
