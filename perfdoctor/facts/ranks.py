"""The cross-rank view of a distributed run (one trace or one run folder per rank): the per-rank
table, the straggler, the imbalance, and the straggler's cause read from its own evidence.

A map-reduce over ranks: each rank is measured on its own (for traces, `RankSummary`: small and
picklable, its facts and summary, never the trace), then `cross_rank` merges the per-rank rows."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from perfdoctor.contracts.report import RankRowDoc, SummaryDoc
from perfdoctor.facts.model import Facts
from perfdoctor.stats import median


@dataclass
class RankSummary:
    """What one rank's trace leaves once measured: its facts and summary (add_trace_facts), the rank
    and where it was read from (settled across the run by trace.settle_ranks), how its steps were
    found, and the events the loader dropped or repaired. Tens of KB whatever the trace's size."""

    path: Path
    rank: int
    rank_source: str
    facts: Facts
    summary: SummaryDoc
    step_source: str
    dropped_last_step: bool
    dropped: dict[str, int] = field(default_factory=dict)


# What can make one rank the straggler, each a column of the rank table measured on every rank: the
# cause is the part by which the straggler exceeds the other ranks' median the most.
CAUSES = (("data_ms", "data loading"), ("compute_ms", "compute"), ("sync_ms", "host syncs"),
          ("gc_ms", "garbage collection"), ("cpu_wait_ms", "waiting for a CPU"))


def _row(rank: int, label: str, f: Facts) -> dict[str, Any]:
    """One rank's row: step time, data wait, compute, communication wait, idle (always there), and each
    of the others where measured (`perfdoctor.model.RANK_COLUMNS`).

    Communication: the GPU's communication kernels not hidden behind compute (step.comm_ms), or the
    host's collectives (comm.host_share of the step, gloo). Compute: the GPU's kernels, or on a CPU run the step's
    forward, backward and optimizer less the host's collectives and Python's garbage collections inside
    them (a run's gc.compute_ms; gc_ms is all the collections' time on the step, wherever they ran). The
    training thread's wait for a CPU (cpu_wait_ms, a run's) stays in it: the thread also waits for a CPU
    on waking from a collective or a data wait, so the wait cannot be placed in one part (`_cause`)."""
    step = f.value("step.time_ms")
    comm = f.value("step.comm_ms")
    share = f.value("comm.host_share") if comm is None else None
    host_comm = round(share * step, 4) if share is not None and step is not None else None
    compute = f.value("step.gpu_kernel_ms")
    gc = f.value("gc.ms")
    if compute is None and host_comm is not None:
        parts = [f.value(n) for n in ("step.forward_ms", "step.backward_ms", "step.optimizer_ms")]
        if all(p is not None for p in parts):
            compute = round(max(0.0, sum(parts) - host_comm - f.value("gc.compute_ms", 0.0)), 4)
    idle = f.value("step.idle_ms")
    row: dict[str, Any] = {"rank": rank, "file": label, "step_ms": step}
    data = f.value("step.data_ms")
    if data is not None:
        row["data_ms"] = round(data, 4)
    row["compute_ms"] = compute
    if comm is not None or host_comm is not None:
        row["comm_ms"] = comm if comm is not None else host_comm
    row["idle_ms"] = idle
    row["idle_fraction"] = round(idle / step, 4) if step and idle is not None else None
    sync = f.value("sync.ms")
    if sync is not None:
        row["sync_ms"] = sync
    if gc is not None:
        row["gc_ms"] = round(gc, 4)
    wait, run = f.value("cpu.wait_ms"), f.value("cpu.run_ms")
    if wait is not None:
        row["cpu_wait_ms"] = round(wait, 4)
        if run is not None and run + wait > 0:
            row["cpu_wait_share"] = round(wait / (run + wait), 4)  # of the time it had work to run
    throttled = f.value("cpu.throttled_ms")
    if throttled is not None:
        row["cpu_throttled_ms"] = round(throttled, 4)
        if f.value("cpu.throttled_periods") is not None:
            row["cpu_throttled_periods"] = f.value("cpu.throttled_periods")
    for key, name in (("gpu_clock_mhz", "gpu.sm_clock_mhz"), ("gpu_throttled_share", "gpu.throttled_share"),
                      ("gpu_throttle", "gpu.throttle_reasons")):
        if f.value(name) is not None:
            row[key] = f.value(name)
    for key, name in (("memory_peak_mib", "memory.peak_bytes"), ("headroom_mib", "memory.headroom_bytes")):
        v = f.value(name)
        if isinstance(v, (int, float)):
            row[key] = round(v / 2**20, 1)  # per rank: its own device's (CUDA), else its process's RSS and the machine's
    if share is not None:
        # a synchronous step lasts as long on every rank: the ranks that wait for the straggler wait
        # inside the collectives, so the rest of the step is each rank's own work (its share, measured
        # in the same profiled steps on every rank)
        row["busy_share"] = round(1.0 - share, 4)
    return row


# Columns left out of every row where no rank has more than 0 in them: no rank was throttled.
THROTTLE_KEYS = ("cpu_throttled_ms", "cpu_throttled_periods", "gpu_throttled_share")


def _cause(rows: list[dict[str, Any]], straggler: dict[str, Any], excess_ms: float,
           same_work: tuple[str, float] | None = None) -> tuple[str, float, str] | None:
    """The part of the step by which the straggler exceeds the other ranks' median the most, by how
    much (ms per step), and the evidence in words; None where no measured part exceeds it by at least
    CAUSE_MIN_SHARE of the straggler's excess in work (`excess_ms`): a part a few microseconds over the
    others' explains nothing. Throttling of its CPUs or its GPU, where it explains that part, is named
    instead (`_throttling`); so is a slower processor, where compute is the part and the straggler does
    the same work as the others (`same_work`: ops or kernels per step, `_same_work`).

    Waiting for a CPU: on a busy machine a thread that has more to run also waits longer for a CPU, so
    the straggler's wait counts only beyond what the other ranks' share of waiting (wait / (run + wait),
    median) would give its own running time; and a thread waits for a CPU mostly while it has work to
    run, so compute's excess counts only beyond that starvation."""
    others = [r for r in rows if r is not straggler]
    excess: dict[str, tuple[float, float, float]] = {}  # key -> (excess, mine, theirs)
    for key, _ in CAUSES:
        mine = straggler.get(key)
        theirs = median([r[key] for r in others if r.get(key) is not None])
        if mine is not None and theirs is not None:
            excess[key] = (mine - theirs, mine, theirs)
    share = median([r["cpu_wait_share"] for r in others if r.get("cpu_wait_share") is not None])
    if "cpu_wait_ms" in excess and share is not None and straggler.get("cpu_wait_share") is not None:
        mine = straggler["cpu_wait_ms"]
        share_s = straggler["cpu_wait_share"]
        run = mine * (1 - share_s) / share_s if share_s > 0 else 0.0
        expected = run * share / (1 - share) if share < 1 else mine
        excess["cpu_wait_ms"] = (mine - expected, mine, expected)
    if "compute_ms" in excess and "cpu_wait_ms" in excess:
        e, mine, theirs = excess["compute_ms"]
        excess["compute_ms"] = (e - max(0.0, excess["cpu_wait_ms"][0]), mine, theirs)
    best: tuple[float, str, str, str] | None = None  # excess, key, cause, what was measured
    for key, name in CAUSES:
        if key not in excess:
            continue
        ex, mine, theirs = excess[key]
        if ex > 0 and (best is None or ex > best[0]):
            base = (f"{theirs:.1f} ms at the other ranks' share of waiting ({share:.0%}, median)"
                    if key == "cpu_wait_ms" and share is not None else f"{theirs:.1f} ms on the other ranks (median)")
            best = (ex, key, name, f"{mine:.1f} ms per step on rank {straggler['rank']}, {base}")
    if best is None or best[0] < CAUSE_MIN_SHARE * excess_ms:
        return None
    return (_throttling(others, straggler, best[1], best[0]) or _slower_processor(straggler, best, same_work)
            or (best[2], round(best[0], 4), f"{best[2]}: {best[3]}"))


def _same_work(per_rank: list[Facts], at: int, gpu: bool) -> tuple[str, float] | None:
    """(what, count per step) where rank `at` runs as many top-level ops per step (CPU; kernel launches
    on a GPU) as the other ranks' median, within SAME_WORK: the same work; else None."""
    name, what = ("kernels.launches_per_step", "kernel launches") if gpu else ("ops.calls_per_step", "operator calls")
    mine = per_rank[at].value(name)
    theirs = median([f.value(name) for i, f in enumerate(per_rank) if i != at and f.value(name) is not None])
    if not mine or not theirs or abs(mine - theirs) > SAME_WORK * theirs:
        return None
    return what, theirs


def _slower_processor(straggler: dict[str, Any], best: tuple[float, str, str, str],
                      same_work: tuple[str, float] | None) -> tuple[str, float, str] | None:
    """A compute excess on the same work as the other ranks' (as many ops or kernels per step): the
    straggler's processor runs it slower (shared with other processes or machines, a lower clock,
    another model), not more of it (uneven shards or sequence lengths, rank-0-only work)."""
    ex, key, _, measured = best
    if key != "compute_ms" or same_work is None:
        return None
    gpu = same_work[0] == "kernel launches"
    name = "a slower GPU" if gpu else "a slower CPU"
    return (name, round(ex, 4),
            f"{name}: {measured}, for the same work ({same_work[1]:.0f} {same_work[0]} per "
            f"step on every rank): rank {straggler['rank']}'s {'GPU' if gpu else 'CPU'} runs it slower "
            f"({'another model, a lower clock or a shared device' if gpu else 'shared with other processes or machines, or a lower clock'})")


def _throttling(others: list[dict[str, Any]], straggler: dict[str, Any], key: str, ex: float
                ) -> tuple[str, float, str] | None:
    """The straggler's cause where throttling explains it: its CPU cgroup's quota (at least half of its
    excess wait for a CPU is throttled time beyond the other ranks'), or its GPU's clock (its compute
    excess, where the GPU's SM clock ran slower than the other ranks' and the slower clock explains at
    least half of it, or a power or thermal throttle reason was set on it more often than on theirs)."""
    r = straggler["rank"]
    if key == "cpu_wait_ms" and straggler.get("cpu_throttled_ms") is not None:
        mine = straggler["cpu_throttled_ms"]
        theirs = median([o["cpu_throttled_ms"] for o in others if o.get("cpu_throttled_ms") is not None]) or 0.0
        if mine - theirs >= ex / 2:
            periods = straggler.get("cpu_throttled_periods")
            held = f" in {periods:.1f} of the quota's periods per step" if periods else ""
            return ("CPU throttling", round(mine - theirs, 4),
                    f"CPU throttling: its CPU cgroup's quota held rank {r} back {mine:.1f} ms per step{held}, "
                    f"{theirs:.1f} ms on the other ranks (median); it waited {straggler['cpu_wait_ms']:.1f} ms per "
                    "step for a CPU in all")
    mhz = straggler.get("gpu_clock_mhz")
    if key != "compute_ms" or mhz is None:
        return None
    their_mhz = median([o["gpu_clock_mhz"] for o in others if o.get("gpu_clock_mhz") is not None])
    if their_mhz is None or mhz >= their_mhz * 0.97:
        return None
    explained = (straggler["compute_ms"] or 0.0) * (1 - mhz / their_mhz)
    share = straggler.get("gpu_throttled_share") or 0.0
    their_share = median([o.get("gpu_throttled_share") or 0.0 for o in others]) or 0.0
    if explained < ex / 2 and share - their_share < 0.25:
        return None
    reasons = f", throttle reasons: {straggler['gpu_throttle']} ({share:.0%} of its readings)" \
        if straggler.get("gpu_throttle") else ""
    return ("GPU throttling", round(ex, 4),
            f"GPU throttling: rank {r}'s GPU ran at {mhz:.0f} MHz (SM clock, median), {their_mhz:.0f} MHz on the "
            f"other ranks (median){reasons}; its compute took {ex:.1f} ms per step more than theirs")


# A straggler works more than the other ranks step after step: a rank whose median work is the highest
# only by the steps' noise (a shared host's scheduling, a few milliseconds a step) is none. The
# permutation test below gives the chance that noise alone makes some rank's work exceed the others'
# as much as the straggler's does; at most MAX_P, or too few steps to test, names the straggler.
MAX_P = 0.1
MIN_TEST_STEPS = 3  # with fewer steps a rank's excess cannot be told from the steps' noise
UNTESTED_MIN_RATIO = 1.1  # with nothing to test it against, only a clear gap names a straggler
EXACT_PERMUTATIONS = 10_000  # up to this many, every relabelling is counted; beyond, a sample
SAMPLE_CELLS = 400_000  # the sample's size: draws * ranks * steps at most (a 64-rank job stays < 0.2 s)
CAUSE_MIN_SHARE = 0.25  # a cause explains at least this share of the straggler's excess in work
SAME_WORK = 0.02  # op (CPU) or kernel (GPU) counts per step this close to the other ranks': the same work


def _work_series(f: Facts, key: str) -> tuple[float, ...]:
    """The rank's work at each of its steps in the measure `key` of the rank table (its share of the
    step outside the host's collectives, its GPU kernels' ms or its step's ms); () where not measured
    step by step."""
    if key == "busy_share":
        share = f.get("comm.host_share")
        return tuple(1.0 - x for x in share.per_step) if share is not None else ()
    fact = f.get("step.gpu_kernel_ms" if key == "compute_ms" else "step.time_ms")
    return fact.per_step if fact is not None else ()


def common_steps(series: list[tuple[float, ...]]) -> list[tuple[float, ...]]:
    """The ranks' per-step series over the steps every rank profiled: the window opens at the same
    planned step on every rank (capture/window.py `plan`), but its time or event budget may end one
    rank's window a step or two early, so the series are cut to the shortest. A rank with no series
    leaves them all as they are (no test then)."""
    n = min((len(s) for s in series), default=0)
    return [s[:n] for s in series] if n else series


def straggler_test(series: list[tuple[float, ...]], seed: int = 0) -> tuple[int, float] | None:
    """The rank (index into `series`, one work series per rank, aligned step by step) whose work
    exceeds the other ranks' most, step by step, and the chance that step-to-step noise alone makes
    some rank's work exceed the others' that much: a permutation test. At each step every rank's work
    is taken less the step's median over the ranks (the step's own slowness is no rank's); a rank's
    excess is the mean of those over the steps (a mean, not a median: a rank ahead at every step
    must count for more than one ahead at most). Were no rank slower than the others, the ranks'
    labels at each step could be exchanged: the p-value is the share of the relabellings (each step's
    labels permuted on their own: all of them where few, else a seeded sample) whose greatest excess
    is as large as the observed. None with fewer than MIN_TEST_STEPS steps or series not aligned.
    Two ranks and 5 steps reach p = 1/16 at best (ahead at every step), 10 steps 1/512."""
    n = len(series[0]) if series else 0
    nranks = len(series)
    if nranks < 2 or n < MIN_TEST_STEPS or any(len(s) != n for s in series):
        return None
    steps: list[list[float]] = []
    for j in range(n):
        col = [s[j] for s in series]
        mid = median(col) or 0.0
        steps.append([v - mid for v in col])

    def excesses(cols: Sequence[Sequence[float]]) -> list[float]:
        return [sum(c[k] for c in cols) / n for k in range(nranks)]

    observed = excesses(steps)
    straggler = max(range(nranks), key=observed.__getitem__)
    top = observed[straggler] - 1e-9 * max(1.0, abs(observed[straggler]))
    if math.factorial(nranks) ** n <= EXACT_PERMUTATIONS:
        total = hits = 0
        for perm in itertools.product(*(itertools.permutations(c) for c in steps)):
            total += 1
            hits += max(excesses(perm)) >= top
        return straggler, hits / total
    rng = random.Random(seed)
    draws = max(200, min(2000, SAMPLE_CELLS // (nranks * n)))
    hits = 0
    for _ in range(draws):
        cols = [rng.sample(c, nranks) for c in steps]
        hits += max(excesses(cols)) >= top
    return straggler, (hits + 1) / (draws + 1)  # the observed labelling is one of the relabellings


def cross_rank(ranks: list[tuple[int, str]], per_rank: list[Facts], source: str = "trace"
               ) -> tuple[Facts, list[RankRowDoc]]:
    """The rank table (one row per (rank, label), from that rank's facts, as report.json's rows), the
    imbalance across ranks,
    and the straggler and its cause where there is one, as facts of `source`.

    The work that tells the straggler: a rank's own share of the step where the host's collectives
    measure the wait (busy_share), else its GPU compute, else its step time. The straggler is the rank
    whose work exceeds the others' most, step by step, where the steps' noise does not explain it
    (`straggler_test`; ranks.imbalance_p); with fewer steps than the test needs, the rank with the most
    work per step, where that is UNTESTED_MIN_RATIO times the median rank's or more. With busy_share
    the imbalance is the job's step over the step it would have with the straggler's share at the
    other ranks' median (the step less the straggler's excess), so that PD012's saving is that
    excess; else the straggler's work over the median rank's."""
    out = Facts()
    rows = [_row(rank, label, f) for (rank, label), f in zip(ranks, per_rank)]
    for k in THROTTLE_KEYS:
        if not any(r.get(k) for r in rows):
            for r in rows:
                r.pop(k, None)
    out.add("ranks.count", len(rows), "count", source)
    key = next((k for k in ("busy_share", "compute_ms") if all(r.get(k) for r in rows)), "step_ms")
    vals = [r[key] for r in rows if r[key] is not None]
    mid = median(vals)
    if len(vals) >= 2 and mid is not None and mid > 0:
        series = common_steps([_work_series(f, key) for f in per_rank])
        test = straggler_test(series) if len(vals) == len(rows) else None
        straggler = rows[test[0]] if test is not None else max(rows, key=lambda r: r[key] or 0)
        others = [r[key] for r in rows if r is not straggler and r[key] is not None]
        if key == "busy_share":
            excess = straggler[key] - (median(others) or 0.0)
            ratio = 1 / max(1 - excess, 1e-9)
            excess_ms = excess * (straggler["step_ms"] or 0.0)
            how = "the job's step / the step with the straggler's share of work at the other ranks' (median)"
        else:
            ratio, excess_ms = straggler[key] / mid, straggler[key] - (median(others) or 0.0)
            how = f"the straggler's {key} / the median rank's"
        out.add("ranks.imbalance_ratio", round(max(ratio, 1.0), 4), "ratio", source, how)
        if test is not None:
            n = len(series[0])
            out.add("ranks.imbalance_p", round(test[1], 4), "ratio", source,
                    f"the chance that the steps' noise alone makes a rank's {key} exceed the others' this much: "
                    f"a permutation test over {n} steps of {len(rows)} ranks (each step's ranks relabelled)")
        if test is not None:
            named = test[1] <= MAX_P
            how = f"rank whose {key} exceeds the others' most, step by step (p = {test[1]:.3f})"
        else:
            named = ratio >= UNTESTED_MIN_RATIO
            how = f"rank with most {key} (too few steps to test against their noise)"
        if named:
            out.add("ranks.straggler", straggler["rank"], "", source, how)
            at = rows.index(straggler)
            same = _same_work(per_rank, at, gpu=per_rank[at].value("step.gpu_kernel_ms") is not None)
            cause = _cause(rows, straggler, excess_ms, same)
            if cause is not None:
                out.add("ranks.straggler_cause", cause[0], "str", source, cause[2])
                out.add("ranks.straggler_excess_ms", cause[1], "ms", source, cause[2])
    idles = [r["idle_fraction"] for r in rows if r["idle_fraction"] is not None]
    if len(idles) >= 2:
        out.add("ranks.idle_spread", round(max(idles) - min(idles), 4), "ratio", source, "max - min idle fraction")
    return out, msgspec.convert(rows, list[RankRowDoc])
