"""nn.DataParallel (one process driving several GPUs) as opposed to DistributedDataParallel."""

from __future__ import annotations

from perfdoctor.facts.trace.context import SRC, TraceContext


def add(ctx: TraceContext) -> None:
    """A `dataparallel` subject where the trace names DataParallel and nothing of DDP."""
    t = ctx.trace
    dp = ddp = False
    for nm in t.strings:
        if "DistributedDataParallel" in nm or nm.startswith(("c10d::", "nccl:all_reduce")) or "Reducer" in nm:
            ddp = True
        elif nm in ("DataParallel.forward", "nn.Module: DataParallel") or nm.startswith("nn.Module: DataParallel_"):
            dp = True
    if dp and not ddp:
        s = ctx.facts.subject("dataparallel", "trace:dataparallel")
        s.add("device_count", len(t.device_properties) or None, "count", SRC)
