"""Gradient accumulation under DistributedDataParallel in a trace alone (PD032): how many backward
passes each optimizer step has, and how many of them all-reduced the gradients.

DDP launches its bucket all-reduces from the hook it puts on every parameter's gradient
accumulation: in the trace, a `c10d::allreduce_` (or `record_param_comms`, `nccl:all_reduce`,
`gloo:all_reduce`) inside an `autograd::engine::evaluate_function: torch::autograd::AccumulateGrad`
span on the same thread, on CPU and GPU runs alike. Collectives a model runs inside its own backward
functions (tensor parallelism) are not there, and are not counted. A backward pass is a run of the
autograd engine's `evaluate_function` spans (on any thread) that no op of the training thread (the
thread of the ProfilerStep and Optimizer.step annotations) outside them interrupts: the next
micro-batch's forward, the loss, the optimizer. An optimizer step is a group of `Optimizer.step#`
annotations with no backward between them; the passes between two of them are one optimizer step's.
Measured over the complete optimizer steps of the trace (the ones between two optimizer steps)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from perfdoctor.facts.trace.context import SRC, TraceContext
from perfdoctor.facts.trace.intervals import merge
from perfdoctor.stats import median
from perfdoctor.trace.model import CPU_OP, KERNEL, USER_ANN

ACCUMULATE = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"


def add(ctx: TraceContext) -> None:
    """A `ddp_sync` subject (syncs_per_step, backwards_per_step, comm_ms) where the optimizer steps
    have several backward passes each and DDP's all-reduces ran in more than one of them. Not where
    the run's DDP probe measured the job (a run folder: its `ddp` subjects say it better)."""
    t = ctx.trace
    if "ddp" in ctx.facts.kinds_from("run"):
        return
    backward = t.names_where(lambda s: s.startswith("autograd::engine::evaluate_function"))
    reduce = t.names_where(lambda s: s in ("c10d::allreduce_", "record_param_comms")
                           or s.startswith(("nccl:all_reduce", "gloo:all_reduce")))
    optimizer = t.names_where(lambda s: s.startswith("Optimizer.step#"))
    if not backward or not reduce or not optimizer:
        return
    loops = t.names_where(lambda s: s.startswith("ProfilerStep#") or s.startswith("Optimizer.step#"))
    cpu = t.indices(CPU_OP, USER_ANN)
    main = {t.track[i] for i in cpu if t.name[i] in loops}
    acc = t.names_where(lambda s: s == ACCUMULATE)
    hooks: dict[int, list[tuple[float, float]]] = {}  # track -> its AccumulateGrad spans
    for i in cpu:
        if t.name[i] in acc:
            hooks.setdefault(t.track[i], []).append((t.ts[i], t.ts[i] + t.dur[i]))
    spans = merge([(t.ts[i], t.ts[i] + t.dur[i]) for i in cpu if t.name[i] in backward])
    starts = [s for s, _ in spans]

    def in_backward(x: float) -> bool:
        k = bisect_right(starts, x) - 1
        return k >= 0 and x <= spans[k][1]

    events: list[tuple[float, str, int]] = []  # (time, B backward / O optimizer / A DDP all-reduce / F other, index)
    for i in cpu:
        n, ts = t.name[i], t.ts[i]
        if n in backward:
            events.append((ts, "B", i))
        elif n in optimizer:
            events.append((ts, "O", i))
        elif n in reduce and any(s <= ts <= e for s, e in hooks.get(t.track[i], ())):
            events.append((ts, "A", i))
        elif t.track[i] in main and n not in loops and not in_backward(ts):
            events.append((ts, "F", i))
    events.sort()
    steps: list[list[tuple[float, float, int | None]]] = []  # per optimizer step: its passes (start, end, an all-reduce)
    cur: list[tuple[float, float, int | None]] | None = None
    start: float | None = None  # the pass under way: its start and its first DDP all-reduce
    first: int | None = None
    for ts, kind, i in events:
        if kind in ("O", "F") and start is not None and cur is not None:
            cur.append((start, ts, first))
            start = first = None
        if kind == "O":
            if cur:
                steps.append(cur)
            cur = []  # consecutive optimizer annotations (one optimizer wrapping another, two optimizers): one step
        elif cur is None:
            continue  # before the first optimizer step: not a complete one
        elif kind == "B" and start is None:
            start = ts
        elif kind == "A" and start is not None and first is None:
            first = i
    if not steps:
        return
    backs = [len(s) for s in steps]
    syncs = [sum(1 for p in s if p[2] is not None) for s in steps]
    if (median(backs) or 0) < 2 or (median(syncs) or 0) < 2:
        return
    synced = [p for s in steps for p in s if p[2] is not None]
    # no location: the trace's Python frames do not give the line that called backward (a frame already
    # running when the profiler started is named by its line then, one entered later by its first line)
    sub = ctx.facts.subject("ddp_sync", "trace:ddp_sync")
    which = f"{len(steps)} complete optimizer steps in the trace"
    sub.add("syncs_per_step", median(syncs), "count", SRC,
            detail=f"backward passes with DDP's all-reduces (inside AccumulateGrad), median over {which}")
    sub.add("backwards_per_step", median(backs), "count", SRC, detail=f"backward passes, median over {which}")
    comm = _comm_ms(ctx, [(s, e) for s, e, _ in synced])
    if comm is not None:
        sub.add("comm_ms", round(comm, 4), "ms", SRC,
                detail=f"the collectives one backward pass started (their spans merged), mean over the {len(synced)} "
                       "that all-reduced")
    sub.add("model", "model", "str", SRC)
    sub.add("statement", "loss.backward()", "str", SRC)


def _comm_ms(ctx: TraceContext, passes: list[tuple[float, float]]) -> float | None:
    """Mean time of one pass's collectives, each pass's merged: gloo's host spans that started in it,
    or the communication kernels it launched (GPU); None where the trace has neither."""
    t = ctx.trace
    found: list[tuple[float, float, float]] = []  # (when it was started on the host, start, end)
    gloo = t.names_where(lambda s: s.startswith("gloo:"))
    found += [(t.ts[i], t.ts[i], t.ts[i] + t.dur[i]) for i in t.indices(CPU_OP, USER_ANN) if t.name[i] in gloo]
    for i in ctx.gpu_events:
        launch = ctx.launches.get(t.corr[i]) if t.kind[i] == KERNEL and ctx.is_comm(t.name[i]) else None
        if launch is not None:
            found.append((t.ts[launch], t.ts[i], t.ts[i] + t.dur[i]))
    if not found:
        return None
    found.sort()
    at = [f[0] for f in found]
    per = []
    for s, e in passes:
        mine = found[bisect_left(at, s):bisect_right(at, e)]
        per.append(sum(b - a for a, b in merge([(a, b) for _, a, b in mine])) / 1000)
    return sum(per) / len(per) if per else None
