"""Collective communication: all-reduces per step and their size, the share of GPU busy time spent
in communication kernels, and how much of it compute on other streams overlaps."""

from __future__ import annotations

from collections import defaultdict

from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.facts.trace.intervals import count_in, merge, per_window, subtract
from perfdoctor.stats import median
from perfdoctor.trace.model import CPU_OP, KERNEL, USER_ANN

_DTYPE_BYTES = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "int": 4, "long int": 8,
                "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int8": 1, "char": 1}


def add(ctx: TraceContext) -> None:
    """comm.allreduce_per_step, comm.allreduce_bytes_median, comm.share, comm.overlap, comm.host_share."""
    t, put, is_comm = ctx.trace, ctx.put, ctx.is_comm
    _host_collectives(ctx)
    comm: list[tuple[float, float, int]] = []  # (start, end, stream) of the kernels
    compute: list[tuple[float, float, int]] = []
    for i in ctx.gpu_events:
        if t.kind[i] == KERNEL:
            (comm if is_comm(t.name[i]) else compute).append((t.ts[i], t.ts[i] + t.dur[i], t.stream[i]))
    ar_ts: dict[str, list[float]] = defaultdict(list)
    sizes: list[int] = []
    ar_names = t.names_where(lambda s: "all_reduce" in s.lower() or "allreduce" in s.lower())
    ops = [i for i in t.indices(CPU_OP, USER_ANN) if t.name[i] in ar_names]
    ops += [i for i, c in t.comm.items() if t.name[i] not in ar_names and "all_reduce" in str(c.get("collective"))]
    for i in ops:  # all-reduce ops (t.comm holds cpu ops and annotations only)
        nm = t.strings[t.name[i]].lower()
        c = t.comm.get(i)
        group = nm.split(":")[0]
        ar_ts[group].append(t.ts[i])
        sh = t.shape(i)
        if c and c.get("in_nelems"):
            sizes.append(c["in_nelems"] * _DTYPE_BYTES.get(str(c.get("dtype")), 4))
        elif sh[1] and isinstance(sh[1][0], list) and all(isinstance(d, int) for d in sh[1][0]):
            nel = 1
            for d in sh[1][0]:
                nel *= d
            sizes.append(nel * _DTYPE_BYTES.get(str(sh[0][0]) if sh[0] else "float", 4))
    per_step = [m for v in ar_ts.values() if (m := median(count_in(v, ctx.cpu_windows))) is not None]
    if per_step:
        put("comm.allreduce_per_step", max(per_step), "count")
    size_med = median(sizes)
    if size_med is not None:
        put("comm.allreduce_bytes_median", int(size_med), "bytes")
    if not comm:
        return
    cm = merge([(s, e) for s, e, _ in comm])
    comm_total = sum(e - s for s, e in cm)
    busy = merge([(s, e) for s, e, _ in comm + compute])
    put("comm.share", comm_total / sum(e - s for s, e in busy), "ratio", "communication / GPU busy time")
    comm_streams = {st for _, _, st in comm}
    other = merge([(s, e) for s, e, st in compute if st not in comm_streams])
    over = comm_total - sum(e - s for s, e in subtract(cm, other))
    put("comm.overlap", over / comm_total if comm_total else 0.0, "ratio",
        "comm time overlapped by compute kernels on other streams")


def _host_collectives(ctx: TraceContext) -> None:
    """comm.host_share: collectives that run on the host (gloo's, on CPU tensors) are spans of the
    trace's `gloo:*` annotations, from the call to the peers' answer: their union's share of each step
    is the share the rank spent communicating, most of it waiting for the slowest rank. A share, not
    ms: the profiled steps are slower than the others, and the rank table applies it to the run's
    step. NCCL's host-side annotations only launch kernels (the GPU's side is step.comm_ms): left out."""
    t = ctx.trace
    names = t.names_where(lambda s: s.lower().startswith("gloo:"))
    if not names or not ctx.nsteps:
        return
    spans = merge([(t.ts[i], t.ts[i] + t.dur[i]) for i in t.indices(CPU_OP, USER_ANN) if t.name[i] in names])
    shares = [v / (e - s) for v, (s, e) in zip(per_window(spans, ctx.cpu_windows), ctx.cpu_windows) if e > s]
    share = median(shares)
    if spans and share is not None:
        ctx.put("comm.host_share", min(1.0, share), "ratio",
                "gloo collectives' share of each profiled step (their spans merged), median over the steps",
                per_step=tuple(min(1.0, x) for x in shares))
