"""Memory-layout transposes around convolutions (PD023): kernels that convert activations between
NCHW and NHWC, per step. cuDNN (`nchwToNhwcKernel`, `nhwcToNchwKernel`) and MIOpen
(`batched_transpose_*`) run them when tensor-core convolution kernels, which want NHWC, are given
NCHW (contiguous) tensors; a model in `torch.channels_last` needs none."""

from __future__ import annotations

import re

from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.trace.model import KERNEL

TRANSPOSE = re.compile(r"nchwToNhwc|nhwcToNchw|nchw_?2_?nhwc|nhwc_?2_?nchw|batched_transpose", re.I)


def add(ctx: TraceContext) -> None:
    """layout.transposes_per_step and layout.transpose_ms (GPU traces; 0 where it has none)."""
    t = ctx.trace
    names = t.names_where(lambda s: bool(TRANSPOSE.search(s)))
    count, us = 0, 0.0
    for i in ctx.gpu_events if names else ():
        if t.kind[i] == KERNEL and t.name[i] in names:
            count += 1
            us += t.dur[i]
    ctx.put("layout.transposes_per_step", count / ctx.per_step, "count", "NCHW<->NHWC transpose kernels")
    ctx.put("layout.transpose_ms", us / 1000 / ctx.per_step, "ms", "NCHW<->NHWC transpose kernel time")
