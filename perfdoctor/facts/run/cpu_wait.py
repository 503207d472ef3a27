"""The CPU-wait probe's records (capture/probes/cpu_wait.py, Linux schedstat and the CPU cgroup's
cpu.stat) -> `cpu.wait_ms` and `cpu.run_ms` (the training thread's wait for a CPU and time on one),
each DataLoader's share of that wait its workers caused (`contention_ms`, PD018), and the CPU
cgroup's throttling (`cpu.throttled_*`): straggler causes in the rank table."""

from __future__ import annotations

import statistics

from perfdoctor.facts.model import site_subject
from perfdoctor.facts.run.context import RunContext

MIN_BASE = 3  # steady steps without crowding workers that PD018's contention is measured against


def add(ctx: RunContext) -> None:
    worker_contention(ctx)
    throttling(ctx)


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
