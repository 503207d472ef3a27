"""The DataLoader: time the training loop waits on it per step, and whether it loads in worker
processes (`_MultiProcessingDataLoaderIter`) or in the main process (num_workers=0)."""

from __future__ import annotations

from perfdoctor.facts.trace.context import SRC, TraceContext
from perfdoctor.facts.trace.intervals import merge, per_window
from perfdoctor.facts.trace.stacks import location
from perfdoctor.stats import median
from perfdoctor.trace.model import CPU_OP, USER_ANN


def add(ctx: TraceContext, data_loading: list[tuple[float, float]]) -> None:
    """A `dataloader` subject (at the user's `for ... in loader` line where the stacks name it)
    with wait_ms and wait_fraction from the spans `data_loading` (µs) of the breakdown."""
    t, windows, step_ms = ctx.trace, ctx.windows, ctx.step_ms
    data_us = per_window(merge(list(data_loading)), ctx.cpu_windows)
    single = multi = False
    site = None
    loaders = t.names_where(lambda s: s.startswith("enumerate(DataLoader)"))
    for i in t.indices(USER_ANN, CPU_OP):
        if t.name[i] in loaders:
            nm = t.strings[t.name[i]]
            single |= "_SingleProcessDataLoaderIter" in nm
            multi |= "_MultiProcessingDataLoaderIter" in nm
            if site is None:
                u = ctx.stacks.frame(i)
                site = u[0] if u else None
    if not (single or multi) or not windows:
        return
    key, loc = location(site) if site else ("trace:dataloader", None)
    s = ctx.facts.subject("dataloader", key)
    if loc and loc not in s.locations:
        s.locations.append(loc)
    wait = [x / 1000 for x in data_us] if data_us else []
    wait_med = median(wait)
    if wait_med is not None:
        s.add("wait_ms", round(wait_med, 4), "ms", SRC, "DataLoader __next__ time per step (median)")
        fr_med = median([w / sm for w, sm in zip(wait, step_ms) if sm])
        s.add("wait_fraction", round(fr_med, 4) if fr_med is not None else None, "ratio", SRC)
    if single and not multi:
        s.add("num_workers", 0, "count", SRC, "_SingleProcessDataLoaderIter in the trace")
        ctx.put("dataloader.num_workers", 0, "count", "_SingleProcessDataLoaderIter in the trace")
    elif multi:
        s.add("multiprocess", True, "", SRC, "_MultiProcessingDataLoaderIter in the trace")
