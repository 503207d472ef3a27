"""Run facts of the checklist rules measured on the steps themselves: worker start-up per epoch
(PD015), gc.collect() calls (PD027), periodic stalls named by the line that runs on them (PD020),
CPU contention from DataLoader workers (PD018), eval-mode forwards that record autograd (PD019),
and torch.compile's graph breaks and recompilations (PD029). Called from `run_facts.load_run`;
never imports torch."""

from __future__ import annotations

import statistics
from typing import Any

from perfdoctor.contracts.run import Probes
from perfdoctor.facts.model import Facts, site_subject

MIN_STALLS = 3  # slow steps a pattern needs among the steady steps (and other steps, as many)
SLOW_MADS = 2.0  # every slow step above the other steps' median by this many (scaled) MADs ...
SLOW_FRACTION = 0.2  # ... and at least this share of that median
SLOW_MIN_MS = 1.0  # ... and at least this much
HIT_RATE = 0.75  # share of the pattern's steps that must be that slow (a loaded machine hides a few)
NORMAL_MAX_SHARE = 0.10  # a line seen in more of the other steps' samples runs on every step
MIN_BASE = 3  # steady steps without crowding workers that PD018's contention is measured against


def worker_startup(facts: Facts, probes: Probes, steady: list[dict[str, Any]]) -> None:
    """PD015: what a DataLoader's epoch start costs beyond a steady step, and that cost per step.

    Measured on the step each epoch's first batch arrived in: its time less the median of the other
    steady steps. That holds the wait for the new workers (`iter()` and the first batch) and what
    starting them costs the training process besides (forking a large process, then copy-on-write
    page faults). The first epoch pays it whatever the settings: the later ones are what persistent
    workers save. Where no epoch start is a steady step, the time to the first batch less the steady
    wait stands in (the wait alone)."""
    walls = {x["i"]: x["wall_ms"] for x in steady}
    for dl in probes.dataloaders:
        s = site_subject(facts, "dataloader", dl.site)
        if s is None:
            continue
        s.add("constructed", dl.constructed, "count")
        first = dl.first_batch_ms
        s.add("epochs", len(first), "count")
        s.add("batches_per_epoch", dl.length, "count")
        if len(first) < 2 or not dl.length or not walls:
            continue
        starts = set(dl.first_batch_step[1:])
        others = [w for i, w in walls.items() if i not in starts]
        on = [walls[i] for i in dl.first_batch_step[1:] if i in walls]
        if on and others:
            base = statistics.median(others)
            extra = [max(0.0, w - base) for w in on]
            startup = statistics.median(extra)
            detail = (f"median over {len(on)} steady epoch-start steps of their time less the other steady steps' "
                      f"median ({base:.1f} ms)")
        else:
            waits = [dl.wait_ms_per_step[i - 1] for i in walls if 0 < i <= len(dl.wait_ms_per_step)]
            if not waits:
                continue
            extra = [max(0.0, x - statistics.median(waits)) for x in first[1:]]
            startup = statistics.median(extra)
            detail = f"median time to the first batch of epochs 2..{len(first)} less the median steady wait"
        s.add("startup_ms", startup, "ms", detail=detail, per_step=tuple(extra))
        s.add("startup_ms_per_step", startup / dl.length, "ms",
              detail=f"startup_ms / {dl.length} batches per epoch")


def gc_calls(facts: Facts, probes: Probes, steady: list[dict[str, Any]]) -> None:
    """PD027: each line calling gc.collect() inside the steps, its calls and time per steady step."""
    idx = {x["i"] for x in steady}
    if not idx:
        return
    for r in probes.gc_calls:
        per = {int(row[0]): (row[1], row[2] if len(row) > 2 else 1) for row in r.ms_by_step
               if len(row) >= 2 and int(row[0]) in idx}
        if not per:
            continue
        s = site_subject(facts, "gc_collect", r.site)
        if s is None:
            continue
        s.add("calls_per_step", sum(n for _, n in per.values()) / len(idx), "count",
              detail=f"steady steps with a call: {len(per)} of {len(idx)}")
        series = tuple(per.get(x["i"], (0.0, 0))[0] for x in steady)
        s.add("ms", statistics.fmean(series), "ms", detail=f"mean over {len(idx)} steady steps", per_step=series)
        s.add("ms_per_call", statistics.median(ms / n for ms, n in per.values() if n), "ms",
              detail="median over the steady steps with a call")


def _period(xs: list[tuple[int, float]]) -> tuple[int, list[int]] | None:
    """(period, the pattern's step indices) for `xs` ((step, ms) pairs): the smallest period with a
    residue class of at least MIN_STALLS steps, HIT_RATE of them slower than the other steps' median
    by clearly more than the others' spread; or None."""
    for p in range(2, len(xs) // MIN_STALLS + 1):
        for r in range(p):
            members = [v for i, v in xs if i % p == r]
            others = [v for i, v in xs if i % p != r]
            if len(members) < MIN_STALLS or len(others) < MIN_STALLS:
                continue
            med = statistics.median(others)
            spread = statistics.median(abs(v - med) for v in others) * 1.4826
            cut = med + max(SLOW_MADS * spread, SLOW_FRACTION * med, SLOW_MIN_MS)
            if sum(v > cut for v in members) >= HIT_RATE * len(members):
                return p, [i for i, _ in xs if i % p == r]
    return None


def periodic_stall(facts: Facts, probes: Probes, steady: list[dict[str, Any]]) -> None:
    """PD020: steps slower every N steps outside data loading, named by the line of the user's
    code that the sampler saw on those steps and hardly ever on the others (the outermost such
    line: the call in the loop, not a line inside the function it calls)."""
    st = probes.stalls
    if st is None or len(steady) < 2 * MIN_STALLS:
        return
    xs = [(int(x["i"]), max(0.0, x["wall_ms"] - (x.get("data_ms") or 0.0))) for x in steady]
    found = _period(xs)
    if found is None:
        return
    p, members = found
    on = set(members)
    normal = [v for i, v in xs if i not in on]
    base = statistics.median(normal)
    extras = [max(0.0, v - base) for i, v in xs if i in on]
    extra = statistics.fmean(extras)
    samples = {int(i): int(c) for i, c in st.samples_by_step}
    n_slow = sum(samples.get(i, 0) for i in on)
    n_norm = sum(samples.get(i, 0) for i, _ in xs if i not in on)
    if not n_slow or not n_norm or extra <= 0:  # no look at the other steps: nothing to tell apart
        return
    # the pattern's steps the sampler watched while they ran long (a step looked at only before its
    # stall began says nothing of what the stall runs); a run file without them: every such step
    late = {int(i) for i, c in st.late_by_step if c > 0}
    watched = sorted(on & late) if late else sorted(on)
    if len(watched) < MIN_STALLS:
        return
    best = None
    for line in st.lines:
        per = {int(i): int(c) for i, c in line.by_step}
        seen_on = sum(1 for i in watched if per.get(i, 0) > 0) / len(watched)
        share_norm = sum(per.get(i, 0) for i, _ in xs if i not in on) / n_norm if n_norm else 0.0
        # it runs on (nearly) every step of the pattern and hardly ever on the others (the sampler
        # looks about once a step, densely only late in a long step: how often it saw a line on a
        # stall says little of how long the line took, so the stall's time comes from the steps)
        if seen_on < HIT_RATE or share_norm > NORMAL_MAX_SHARE:
            continue
        key = (line.depth, -seen_on)
        if best is None or key < best[0]:
            best = (key, line, seen_on)
    if best is None:
        return
    _, line, share = best
    s = site_subject(facts, "periodic_stall", line.site)
    if s is None:
        return
    s.add("period", p, "count", detail=f"steps {', '.join(str(i) for i in members)} of the steady steps")
    s.add("stalls", len(members), "count")
    s.add("extra_ms", extra, "ms", detail=f"mean over the pattern's steps, against the others' median "
          f"{base:.1f} ms (step time less data loading)", per_step=tuple(extras))
    s.add("ms_per_step", sum(extras) / len(xs), "ms", detail=f"the stalls' extra time over {len(xs)} steady steps")
    s.add("share", share, "ratio", detail=f"of the {len(watched)} of the pattern's {len(on)} steps watched while they ran long; seen in at most "
          f"{NORMAL_MAX_SHARE:.0%} of the other steps' samples")


def eval_grad(facts: Facts, probes: Probes, steady: list[dict[str, Any]]) -> None:
    """PD019: each line calling a module in eval mode with grad mode on: its calls and forward time
    per steady step, the bytes autograd saved per call for a backward, and how many of the measured
    calls a backward then used (a model kept in eval mode while it trains, to freeze BatchNorm, is
    not an evaluation)."""
    idx = [x["i"] for x in steady]
    for r in probes.eval_grad:
        s = site_subject(facts, "eval_grad", r.site)
        if s is None or not r.calls:
            continue
        s.add("module", r.module)
        per = {int(row[0]): (row[1], row[2] if len(row) > 2 else 1) for row in r.ms_by_step if len(row) >= 2}
        if idx:
            series = tuple(per.get(i, (0.0, 0))[0] for i in idx)
            s.add("calls_per_step", sum(per.get(i, (0.0, 0))[1] for i in idx) / len(idx), "count",
                  detail=f"mean over {len(idx)} steady steps; {r.calls} calls in the run")
            s.add("ms", statistics.fmean(series), "ms", detail=f"time in these forwards, mean over {len(idx)} steady steps",
                  per_step=series)
        if r.saved_bytes:
            n = len(r.saved_bytes)
            s.add("measured", n, "count")
            s.add("saved_bytes", statistics.median(r.saved_bytes), "bytes",
                  detail=f"median over the first {n} calls of the tensors autograd saved for a backward "
                         "(activations and inputs; parameters not counted)")
            s.add("backward_share", r.backward / n, "ratio", detail=f"{r.backward} of {n} measured calls")


def compile_breaks(facts: Facts, probes: Probes, steady: list[dict[str, Any]]) -> None:
    """PD029: each user line torch.compile broke a graph at, with dynamo's reason; each compiled
    function recompiled on the steady steps, with the guard that failed and the compile time spread
    over the steady steps."""
    c = probes.compile
    if c is None:
        return
    idx = {x["i"] for x in steady}
    for b in c.graph_breaks:
        s = site_subject(facts, "graph_break", b.site)
        if s is None:
            continue
        s.add("kind", "graph break")
        s.add("reason", b.reason)
        steps = sorted(set(b.steps))  # dynamo may note a break twice in one compilation (its restart)
        s.add("count", len(steps), "count", detail=f"compilations that broke the graph here, at steps {_steps(steps)}")
    breaks = {(b.site.file, b.site.line) for b in c.graph_breaks if b.site is not None}
    for f in c.frames:
        later = f.compiles[1:]  # the first compilation of a frame is not a recompilation
        on = [ms for i, ms in ((int(x[0]), x[1]) for x in later) if i in idx]
        # (a frame resumed after a break starts at the break's line: that line is reported as the break)
        if not later or not idx or f.site is None or (f.site.file, f.site.line) in breaks:
            continue
        s = site_subject(facts, "graph_break", f.site)
        if s is None:
            continue
        s.add("kind", "recompile")
        s.add("reason", f.reasons[0] if f.reasons else "")
        s.add("count", len(later), "count", detail=f"recompilations of {f.name} at steps "
              f"{_steps([int(x[0]) for x in later])}")
        s.add("steady", len(on), "count", detail=f"of them on the {len(idx)} steady steps")
        if on:
            s.add("ms", sum(on) / len(idx), "ms", detail=f"{sum(on):.0f} ms compiling on the steady steps, "
                  f"spread over {len(idx)} steady steps")


def _steps(xs: list[int]) -> str:
    shown = ", ".join(str(i) for i in xs[:8])
    return shown + (f" and {len(xs) - 8} more" if len(xs) > 8 else "")


def worker_contention(facts: Facts, probes: Probes, steady: list[dict[str, Any]]) -> None:
    """PD018: how long the training thread waited for a CPU on the steady steps, and the part of it
    the DataLoader workers beyond the CPUs caused.

    Per step, the workers runnable at once on average (their time on a CPU plus their run-queue
    wait, over the step). On the steps where more were runnable than the CPUs beside the training
    thread (usable CPUs - 1, at least 1), the training thread's wait above its median wait on the
    other steady steps (what the rest of the machine costs it anyway), times the share of the
    runnable workers that were beyond those CPUs: the wait that fewer workers would not have
    caused. Spread over the steady steps. Not measured with fewer than MIN_BASE steps to compare
    with."""
    w = probes.cpu_wait
    cpus = facts.value("cpu.count")
    if w is None or not steady:
        return
    at = [x["i"] - 1 for x in steady if 0 <= x["i"] - 1 < len(w.wait_ms)]
    if not at or len(at) < len(steady) // 2:
        return
    waits = tuple(w.wait_ms[k] for k in at)
    what = "the training thread's run-queue wait (schedstat)" + (
        " and the CPU cgroup's throttled time" if w.cgroup else "")
    facts.add("cpu.wait_ms", statistics.fmean(waits), "ms", detail=f"{what}, mean over {len(at)} steady steps",
              per_step=waits)
    if len(w.run_ms) >= len(w.wait_ms):
        facts.add("cpu.run_ms", statistics.fmean(w.run_ms[k] for k in at), "ms",
                  detail=f"the training thread's time on a CPU, mean over {len(at)} steady steps")
    loaders = [dl for dl in probes.dataloaders if (dl.kwargs.num_workers or 0) > 0 and dl.site is not None]
    if not loaders or not isinstance(cpus, int) or len(w.workers_run_ms) < len(w.wait_ms):
        return
    walls = {x["i"] - 1: x["wall_ms"] for x in steady}
    room = max(1, cpus - 1)
    runnable = [(w.workers_run_ms[k] + w.workers_wait_ms[k]) / walls[k] if walls.get(k) else 0.0 for k in at]
    base = [w.wait_ms[k] for k, n in zip(at, runnable) if n <= room]
    if len(base) < MIN_BASE:
        return
    usual = statistics.median(base)
    cost = tuple(max(0.0, w.wait_ms[k] - usual) * (n - room) / n if n > room else 0.0 for k, n in zip(at, runnable))
    crowded = sum(n > room for n in runnable)
    for dl in loaders:
        s = site_subject(facts, "dataloader", dl.site)
        if s is None:
            continue
        s.add("workers_runnable", statistics.fmean(runnable), "count",
              detail=f"workers on a CPU or waiting for one, mean over {len(at)} steady steps (schedstat)")
        s.add("contention_ms", statistics.fmean(cost), "ms",
              detail=f"on the {crowded} steady step(s) with more workers runnable than the {room} CPU(s) beside "
                     f"the training thread, its wait above its median on the other {len(base)} ({usual:.1f} ms), "
                     "times the share of the workers beyond those CPUs; spread over every steady step",
              per_step=cost)
