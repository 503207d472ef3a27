"""The CPU-wait probe's records (capture/probes/cpu_wait.py, Linux schedstat and the CPU cgroup's
cpu.stat) -> `cpu.wait_ms` and `cpu.run_ms` (the training thread's wait for a CPU and time on one),
each DataLoader's share of that wait its workers caused (`contention_ms`, PD018), the CPU
cgroup's throttling (`cpu.throttled_*`): straggler causes in the rank table; and how far other
processes inflated the step times (`contention`: `cpu.wait_share`, `cpu.contended`, the process
tree's CPU time, the CPUs the machine's other processes kept busy, the host's CPU pressure, steal time
and load), with the report's sentence and a step breakdown that shows the wait apart from the work."""

from __future__ import annotations

import statistics

from perfdoctor.contracts.report import BreakdownDoc, ContentionDoc, SummaryDoc
from perfdoctor.facts.model import site_subject
from perfdoctor.facts.run.context import RunContext
from perfdoctor.stats import ms_text, others_cpus

MIN_BASE = 3  # steady steps without crowding workers that PD018's contention is measured against
# The steady steps' wall time the training thread spent waiting for a CPU beyond which the step
# times are inflated materially: the report says so and shows the wait in the step's breakdown.
CONTENTION_SHARE = 0.05
WAIT_CATEGORY = "waiting for a CPU"


def add(ctx: RunContext) -> None:
    worker_contention(ctx)
    throttling(ctx)
    contention(ctx)


def contention(ctx: RunContext) -> None:
    """How far other processes inflated the steady steps: the training thread's wait for a CPU as a
    share of their wall time (`cpu.wait_share`; `cpu.contended` at CONTENTION_SHARE or more), the
    process tree's CPU time per step, the CPUs the other processes kept busy (`host.others_cpus`), the
    host's CPU pressure (PSI), the VM's steal time and the load average. The summary's `contention` holds them; where the wait is material, a sentence in the
    notes says so, and the step's breakdown shows the wait as a part of its own (each step's parts
    scaled by its share of time not waiting, the wait its own share: the parts still add up)."""
    facts, w, steady = ctx.facts, ctx.probes.cpu_wait, ctx.steady
    at = [int(x["i"]) - 1 for x in steady if 0 <= int(x["i"]) - 1 < len(w.wait_ms)] if w is not None else []
    if w is None or not at or len(at) < len(steady) // 2:
        return
    walls = [x["wall_ms"] for x in steady if 0 <= int(x["i"]) - 1 < len(w.wait_ms)]
    total = sum(walls)
    if total <= 0:
        return
    waits = [min(w.wait_ms[k], wall) for k, wall in zip(at, walls)]
    share = sum(waits) / total
    n = len(at)
    facts.add("cpu.wait_share", share, "ratio", detail=f"the training thread's wait for a CPU over the wall time of {n} "
              "steady steps", per_step=tuple(x / wall if wall > 0 else 0.0 for x, wall in zip(waits, walls)))
    facts.add("step.work_ms", statistics.median(wall - x for x, wall in zip(waits, walls)), "ms",
              detail=f"median of {n} steady steps' wall time less the training thread's wait for a CPU")
    inflated = share >= CONTENTION_SHARE
    facts.add("cpu.contended", inflated, detail=f"waited {share:.0%} of the steady steps' time "
              f"({'at least' if inflated else 'under'} {CONTENTION_SHARE:.0%})")
    doc = ContentionDoc(wait_ms=round(statistics.fmean(waits), 3), share=round(share, 4), inflated=inflated)
    if len(w.run_ms) == len(w.wait_ms):
        doc.run_ms = round(statistics.fmean(w.run_ms[k] for k in at), 3)
    if len(w.tree_ms) == len(w.wait_ms):
        tree = statistics.fmean(w.tree_ms[k] for k in at)
        facts.add("cpu.tree_ms", tree, "ms", detail=f"this process's threads (not perfdoctor's) and its DataLoader workers, mean over {n} "
                  "steady steps")
        doc.tree_ms = round(tree, 3)
        # one of several ranks on a node: its siblings are among the machine's other processes, and its
        # CPUs are its share already (cpu.count): the figure would count them twice
        shared = ctx.rank is not None and (ctx.rank.local_world_size or 1) > 1
        whole = w.whole_tree_ms()  # perfdoctor's own threads are this tree's, not the machine's other processes'
        others = others_cpus([w.machine_ms[k] for k in at], [whole[k] for k in at], walls) \
            if len(w.machine_ms) == len(w.wait_ms) and not shared else None
        if others is not None:
            facts.add("host.others_cpus", others, "number", detail=f"the machine's CPU time (/proc/stat) less this process "
                      f"tree's, over the wall time of {n} steady steps")
    if w.pressure and len(w.pressure_ms) == len(w.wait_ms):
        pressure = min(1.0, sum(w.pressure_ms[k] for k in at) / total)
        facts.add("host.cpu_pressure", pressure, "ratio", detail=f"/proc/pressure/cpu 'some' over {n} steady steps")
        doc.host_pressure = round(pressure, 4)
    if len(w.steal_ms) == len(w.wait_ms):
        steal = statistics.fmean(w.steal_ms[k] for k in at)
        facts.add("host.steal_ms", steal, "ms", detail=f"/proc/stat steal, all CPUs, mean over {n} steady steps")
        doc.steal_ms = round(steal, 3)
    if w.loadavg:
        facts.add("host.load_avg", w.loadavg[0], "number", detail="1-minute load average at the run's start"
                  + (f"; {w.loadavg_end[0]:g} at its end" if w.loadavg_end else ""))
        doc.loadavg = [w.loadavg[0]] + ([w.loadavg_end[0]] if w.loadavg_end else [])
    sentence = (f"the training thread waited {ms_text(doc.wait_ms)} per step for a CPU, {share:.0%} of the step: "
                f"other processes compete for these cores; step times are inflated"
                + (f" (host load average {w.loadavg[0]:g})" if w.loadavg else ""))
    if inflated:
        doc.sentence = sentence
        ctx.notes.insert(0, sentence)
        _breakdown_with_wait(ctx.summary, share)
    ctx.summary.contention = doc


def _breakdown_with_wait(summary: SummaryDoc, share: float) -> None:
    """The summary's breakdown with the wait for a CPU as a part of its own: every part scaled by
    the share of the step not spent waiting, the wait the rest (it still adds up to the step)."""
    rows = summary.breakdown
    step = sum(r.ms or 0.0 for r in rows)
    if not rows or step <= 0:
        return
    out = [BreakdownDoc(r.category, round((r.ms or 0.0) * (1 - share), 4), round((r.fraction or 0.0) * (1 - share), 4))
           for r in rows]
    out.append(BreakdownDoc(WAIT_CATEGORY, round(step * share, 4), round(share, 4)))
    summary.breakdown = out


def worker_contention(ctx: RunContext) -> None:
    """PD018: how long the training thread waited for a CPU on the steady steps, and the part of it
    the DataLoader workers beyond the CPUs caused.

    Per step, the workers runnable at once on average (their time on a CPU plus their run-queue
    wait, over the step). On the steps where more were runnable than the CPUs beside the training
    thread (usable CPUs - 1, at least 1), the training thread's wait above its median wait on the
    other steady steps (what the rest of the machine costs it anyway), times the share of the
    runnable workers that were beyond those CPUs: the wait that fewer workers would not have
    caused. Spread over the steady steps. Not measured with fewer than MIN_BASE steps to compare
    with."""
    facts, probes, steady = ctx.facts, ctx.probes, ctx.steady
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
        s = site_subject(facts, "dataloader", dl.judged_site)
        if s is None:
            continue
        s.add("workers_runnable", statistics.fmean(runnable), "count",
              detail=f"workers on a CPU or waiting for one, mean over {len(at)} steady steps (schedstat)")
        s.add("contention_ms", statistics.fmean(cost), "ms",
              detail=f"on the {crowded} steady step(s) with more workers runnable than the {room} CPU(s) beside "
                     f"the training thread, its wait above its median on the other {len(base)} ({usual:.1f} ms), "
                     "times the share of the workers beyond those CPUs; spread over every steady step",
              per_step=cost)


def throttling(ctx: RunContext) -> None:
    """The CPU cgroup's quota on the steady steps, where cpu.stat was readable: `cpu.throttled_ms`,
    `cpu.throttled_periods` (a straggler rank's "CPU throttling")."""
    w = ctx.probes.cpu_wait
    at = [int(x["i"]) - 1 for x in ctx.steady]
    if w is not None and w.cgroup and at and all(0 <= k < len(w.throttled_ms) for k in at):
        series = tuple(w.throttled_ms[k] for k in at)
        ctx.facts.add("cpu.throttled_ms", statistics.fmean(series), "ms",
                      detail=f"the CPU cgroup's throttled time (cpu.stat), mean over {len(at)} steady steps",
                      per_step=series)
        if len(w.throttled_periods) == len(w.throttled_ms):
            ctx.facts.add("cpu.throttled_periods", statistics.fmean(w.throttled_periods[k] for k in at), "number",
                          detail=f"nr_throttled (cpu.stat), mean over {len(at)} steady steps")
