"""torch.cuda.empty_cache(): the allocator's frees per step, and one `empty_cache` subject per
call site the python stacks name (the outermost `empty_cache` frame, so a wrapper around torch's, such
as perfdoctor's own probe in a run's trace, counts once, at the user's line that called it).

What the calls cost, `empty_cache.cost_share` (each subject its calls' part of it): the median over the
profiled steps of the share of the step in torch's own `empty_cache` frames (the release of the cached
blocks: a device sync and a cudaFree per block) and in the step's cudaMalloc/cudaFree calls outside them
(the blocks allocated again). A caching allocator in steady state makes no such call, so they are the
cost of emptying its cache (or of memory still growing). On the H200 the pd005 sample's call took
5-12 us a step and freed nothing (its blocks were all in use): `perfdoctor verify` measured no saving
(+0.03 ms, 90 % interval -0.13..+0.20) where PD005 said medium with no number."""

from __future__ import annotations

from perfdoctor.facts.trace.context import SRC, TraceContext
from perfdoctor.facts.trace.intervals import count_in, merge, share_per_window
from perfdoctor.facts.trace.stacks import location
from perfdoctor.stats import median
from perfdoctor.trace.model import DRIVER, PYFUNC, RUNTIME

_FREE_CALLS = {"cudaFree", "hipFree", "cuMemFree", "cuMemFree_v2"}
_ALLOC_CALLS = _FREE_CALLS | {"cudaMalloc", "hipMalloc", "cuMemAlloc", "cuMemAlloc_v2", "cudaMallocAsync",
                              "cudaFreeAsync", "cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease"}
TORCH_FRAME = ("torch/cuda/", "torch/hip/")  # torch's own empty_cache (a wrapper's time is the wrapper's)


def add(ctx: TraceContext) -> None:
    """empty_cache.free_calls_per_step and the empty_cache subjects (GPU traces)."""
    t, stacks, ns = ctx.trace, ctx.stacks, ctx.per_step
    name, ts, dur = t.name, t.ts, t.dur
    free_names = t.names_where(_FREE_CALLS.__contains__)
    alloc_names = t.names_where(_ALLOC_CALLS.__contains__)  # the free calls among them
    free_ts: list[float] = []
    allocs: list[tuple[float, float]] = []  # every allocator call's span (for the calls' cost)
    if alloc_names:
        for i in t.indices(RUNTIME, DRIVER):
            if name[i] in alloc_names:
                allocs.append((ts[i], ts[i] + dur[i]))
                if name[i] in free_names:
                    free_ts.append(ts[i])
    ctx.put("empty_cache.free_calls_per_step", median(count_in(free_ts, ctx.cpu_windows)), "count",
            "cudaFree/hipFree calls")
    calls = t.names_where(lambda s: s.endswith(": empty_cache"))
    frames: list[tuple[float, float]] = []  # torch's own empty_cache frames (for the calls' cost)
    for i in t.indices(PYFUNC):
        if name[i] in calls:
            if t.strings[name[i]].startswith(TORCH_FRAME):
                frames.append((ts[i], ts[i] + dur[i]))
            p = stacks.by_id.get(t.corr[i])  # the python caller of empty_cache
            if p is not None and name[p] in calls:
                continue  # torch's own, inside a wrapper already counted (perfdoctor's probe, a library's)
            u = None
            seen: set[int] = set()
            while p is not None and p not in seen and not (u := stacks.named_frame(name[p])):
                seen.add(p)  # up to the user's line: a library's helper that empties the cache is called from it
                p = stacks.by_id.get(t.corr[p])
            key, loc = location(u) if u else ("trace:empty_cache", None)
            s = ctx.facts.subject("empty_cache", key)
            if loc and loc not in s.locations:
                s.locations.append(loc)
            prev = s.facts.get("empty_cache.calls_per_step")
            s.add("calls_per_step", (prev.value if prev else 0.0) + 1 / ns, "count", SRC)
            s.add("in_loop", any(a <= ts[i] <= b for a, b in ctx.cpu_windows), "", SRC)
            s.add("free_calls_per_step", len(free_ts) / ns, "count", SRC)
    _cost(ctx, frames, allocs)


def _cost(ctx: TraceContext, frames: list[tuple[float, float]], allocs: list[tuple[float, float]]) -> None:
    """empty_cache.cost_share from torch's empty_cache frames and the allocator calls' spans."""
    subjects = ctx.facts.of_kind("empty_cache")
    if not frames or not ctx.windows or not subjects:
        return
    spans = merge(frames + allocs)  # a cudaFree inside a frame counts once
    shares = share_per_window(spans, ctx.windows)
    share = median(shares)
    ctx.put("empty_cache.cost_share", share, "ratio",
            "share of the profiled step in torch's empty_cache calls and the step's cudaMalloc/cudaFree calls",
            per_step=tuple(round(v, 5) for v in shares))
    counted = [s for s in subjects if s.facts.get("empty_cache.calls_per_step") is not None]
    total = sum(s.facts["empty_cache.calls_per_step"].value for s in counted) or 1.0
    for s in counted:
        s.add("cost_share", round(share * s.facts["empty_cache.calls_per_step"].value / total, 5), "ratio", SRC,
              "its calls' part of empty_cache.cost_share")
