"""Whether the convolutions' input shapes come back from step to step (PD016): cuDNN's autotuner
(`torch.backends.cudnn.benchmark`) times the candidate algorithms once per new input shape and keeps
the fastest, so it pays where a step feeds the convolutions shapes an earlier step fed them (a fixed
image size) and costs where every step brings new ones (padded batches of variable length: a
character CNN over each batch's longest word, a 1-D convolution over each batch's longest sequence).

Read from the trace's forward convolution ops (`aten::convolution`, the dispatcher's entry for every
convolution on CPU and GPU alike) and their recorded input shapes: one signature per profiled step (the
sorted shapes of every convolution it ran), and the share of steps after the first whose signature an
earlier step had (`conv.shape_reuse`). Only where at least two steps ran convolutions with shapes
recorded."""

from __future__ import annotations

from bisect import bisect_right

from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.trace.model import CPU_OP

_CONV = "aten::convolution"


def add(ctx: TraceContext) -> None:
    """conv.shape_reuse."""
    t = ctx.trace
    windows = ctx.cpu_windows
    if len(windows) < 2:
        return
    starts = [s for s, _ in windows]
    shapes: list[list[str]] = [[] for _ in windows]
    for i in t.shapes:
        if t.kind[i] != CPU_OP or t.strings[t.name[i]] != _CONV:
            continue
        k = bisect_right(starts, t.ts[i]) - 1
        if k < 0 or t.ts[i] > windows[k][1]:
            continue
        dims = t.shape(i)[1]
        if dims:
            shapes[k].append(repr(dims[0]))  # the input's shape (the weight's never changes)
    signatures = [tuple(sorted(s)) for s in shapes if s]
    if len(signatures) < 2:
        return
    repeats = sum(1 for n, sig in enumerate(signatures) if n and sig in signatures[:n])
    distinct = len(set(signatures))
    ctx.put("conv.shape_reuse", repeats / (len(signatures) - 1), "ratio",
            f"{repeats} of {len(signatures) - 1} steps after the first fed the convolutions input shapes an "
            f"earlier step had ({distinct} distinct step shape{'s' if distinct != 1 else ''})")
