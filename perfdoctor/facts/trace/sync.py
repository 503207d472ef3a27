"""Host-device synchronisations inside the steps: how many per step, how long the CPU waited, and
at which of the user's lines (where the trace has python stacks)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from perfdoctor.facts.trace.context import SRC, TraceContext
from perfdoctor.facts.trace.intervals import count_in
from perfdoctor.facts.trace.stacks import location
from perfdoctor.stats import median
from perfdoctor.trace.model import CPU_OP, DRIVER, RUNTIME

_SYNC_CALLS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "hipStreamSynchronize",
               "hipDeviceSynchronize", "hipEventSynchronize", "cudaMemcpy", "hipMemcpy", "cuStreamSynchronize",
               "cuCtxSynchronize"}


def add(ctx: TraceContext) -> None:
    """sync.count_per_step, sync.ms and one `sync` subject per user line (GPU traces)."""
    t, windows, stacks, ns = ctx.trace, ctx.cpu_windows, ctx.stacks, ctx.per_step
    name, ts, dur = t.name, t.ts, t.dur
    sync_ts, sync_ms = [], 0.0
    sites: dict[str, list] = {}
    sync_names = t.names_where(_SYNC_CALLS.__contains__)
    starts = [a for a, _ in windows]
    for i in t.indices(RUNTIME, DRIVER):
        if name[i] in sync_names:
            j = bisect_right(starts, ts[i]) - 1
            if j < 0 or ts[i] >= windows[j][1]:  # not inside a step
                continue
            sync_ts.append(ts[i])
            sync_ms += dur[i]
            u = stacks.frame(i)
            if u:
                key, loc = location(u[0])
                sites.setdefault(key, [loc, 0, 0.0])
                sites[key][1] += 1
                sites[key][2] += dur[i]
    lsd_names = t.names_where("aten::_local_scalar_dense".__eq__)
    lsd = [i for i in t.indices(CPU_OP) if name[i] in lsd_names]
    # an .item() whose sync call the trace did not record (blocklisted runtime) still syncs
    st = sorted(sync_ts)
    for i in lsd:
        if bisect_left(st, ts[i]) == bisect_right(st, ts[i] + dur[i]):
            sync_ts.append(ts[i])
    ctx.put("sync.count_per_step", median(count_in(sync_ts, windows)), "count", "host-device syncs per step")
    ctx.put("sync.ms", sync_ms / 1000 / ns, "ms", "time the CPU spent blocked in sync calls, per step")
    for key, (loc, cnt, ms) in sites.items():
        s = ctx.facts.subject("sync", key)
        s.locations.append(loc) if loc not in s.locations else None
        s.add("count_per_step", cnt / ns, "count", SRC)
        s.add("ms", ms / 1000 / ns, "ms", SRC)
