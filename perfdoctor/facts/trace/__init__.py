"""A loaded trace -> facts (source "trace"): step time and breakdown, GPU idle, syncs, copies,
matmul precision, communication, DataParallel, DataLoader wait, noise-free counters; and the
cross-rank view of a folder of per-rank traces.

One module per family of facts, each an `add(ctx)` over one shared `TraceContext` (the trace, its
step windows, launch map, GPU events and python stacks, built once), in the manner of Holistic
Trace Analysis's analyzers. Shared machinery: `intervals` (interval algebra), `stacks` (the user's
frame of a CPU event). Everything is measured per step, then the median across steps is reported.
"""

from __future__ import annotations

from typing import Any

from perfdoctor.facts.model import Facts
from perfdoctor.facts.trace import (
    breakdown,
    comm,
    copies,
    counters,
    dataloader,
    dataparallel,
    device,
    empty_cache,
    gpu,
    layout,
    matmul,
    sync,
)
from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.facts.trace.ranks import cross_rank
from perfdoctor.trace.model import Trace, gc_paused

__all__ = ["add_trace_facts", "cross_rank"]


def add_trace_facts(trace: Trace, facts: Facts) -> dict[str, Any]:
    """Measure the trace, add facts (source "trace", never overwriting), return the summary dict."""
    with gc_paused():
        ctx = TraceContext(trace, facts)
        steps = breakdown.add(ctx)
        device.add(ctx)
        summary = dict(steps.summary)
        if ctx.gpu:
            summary.update(gpu.add(ctx))
            sync.add(ctx)
            copies.add(ctx)
            empty_cache.add(ctx)
            layout.add(ctx)
        matmul.add(ctx)
        comm.add(ctx)
        dataparallel.add(ctx)
        dataloader.add(ctx, steps.data_loading)
        counters.add(ctx)
        return summary
