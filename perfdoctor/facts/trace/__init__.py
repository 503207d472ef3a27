"""A loaded trace -> facts (source "trace"): step time and breakdown, GPU idle, syncs, copies,
matmul precision, communication, DataParallel, DataLoader wait, noise-free counters, the step a CPU run of a
CUDA script would take on a reference GPU (`target_gpu`). A folder of
per-rank traces is merged by perfdoctor.facts.ranks.

One module per family of facts, each an `add(ctx)` over one shared `TraceContext` (the trace, its
step windows, launch map, GPU events and python stacks, built once), in the manner of Holistic
Trace Analysis's analyzers. Shared machinery: `intervals` (interval algebra), `stacks` (the user's
frame of a CPU event). Everything is measured per step, then the median across steps is reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfdoctor.contracts.report import ComputeModuleDoc, SummaryDoc
from perfdoctor.facts.model import Facts
from perfdoctor.facts.ranks import RankSummary
from perfdoctor.facts.trace import (
    allocations,
    anomaly,
    breakdown,
    comm,
    conv_shapes,
    copies,
    counters,
    dataloader,
    dataparallel,
    ddp_sync,
    device,
    empty_cache,
    flops,
    gpu,
    layout,
    mask_sync,
    matmul,
    optimizer_loop,
    sync,
    target_gpu,
)
from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.trace.loader import load_trace
from perfdoctor.trace.model import Trace, gc_paused

__all__ = ["add_trace_facts", "summarise_trace"]


def add_trace_facts(trace: Trace, facts: Facts, *, run_step_ms: float | None = None,
                    steps_label: str = "", modules: list[ComputeModuleDoc] | None = None,
                    user_files: list[Path] | None = None) -> SummaryDoc:
    """Measure the trace, add facts (source "trace", never overwriting), return its summary.
    Where the trace comes from a run folder: `run_step_ms`, the run's median unprofiled step (the
    GPU's idle time is then the run's step less the GPU's busy time, `context.TraceContext`), and
    `steps_label`, the run's steps the trace recorded, added to every global fact's detail, and
    `modules`, the run's modules with the most FLOPs, whose forward the trace times (`flops.module_rates`), and `user_files`, the run's
    files, where the trace's frames (named by file name only) are read (`allocations`)."""
    with gc_paused():
        ctx = TraceContext(trace, facts, run_step_ms, steps_label, modules, user_files)
        steps = breakdown.add(ctx)  # the step windows every other family measures in: not contained
        summary = steps.summary
        families: list[tuple[Any, tuple[Any, ...]]] = [(device.add, ())]
        if ctx.gpu:
            families += [(gpu.add, (steps.gpu_parts, summary)), (sync.add, ()), (copies.add, ()), (empty_cache.add, ()),
                         (layout.add, ())]
        families += [(optimizer_loop.add, ()), (matmul.add, ()), (conv_shapes.add, ()), (flops.add, (summary,)), (allocations.add, ()), (comm.add, ()),
                     (dataparallel.add, ()), (ddp_sync.add, ()),
                     (dataloader.add, (steps.data_loading,)), (counters.add, ()), (target_gpu.add, ()), (mask_sync.add, ()),
                     (anomaly.add, ())]
        for add, args in families:  # each one family of facts (`Facts.family`)
            with facts.family(f"the trace's {add.__module__.rsplit('.', 1)[-1]} facts"):
                add(ctx, *args)
        return summary


def summarise_trace(path: Path) -> RankSummary:
    """Load one trace file and measure it; keep only what the report needs (the trace is freed on
    return). The rank is the file's own (distributedInfo, else its name); a folder of ranks settles
    them across files (perfdoctor.trace.settle_ranks). Raises InputError."""
    trace = load_trace(path)
    facts = Facts()
    summary = add_trace_facts(trace, facts)
    return RankSummary(path=trace.path, rank=trace.rank, rank_source=trace.rank_source, facts=facts,
                       summary=summary, step_source=trace.step_source,
                       dropped_last_step=trace.dropped_last_step, dropped=dict(trace.dropped))
