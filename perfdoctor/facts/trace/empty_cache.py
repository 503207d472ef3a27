"""torch.cuda.empty_cache(): the allocator's frees per step, and one `empty_cache` subject per
call site the python stacks name (the outermost `empty_cache` frame, so a wrapper around torch's, such
as perfdoctor's own probe in a run's trace, counts once, at the user's line that called it)."""

from __future__ import annotations

from perfdoctor.facts.trace.context import SRC, TraceContext
from perfdoctor.facts.trace.intervals import count_in
from perfdoctor.facts.trace.stacks import location
from perfdoctor.stats import median
from perfdoctor.trace.model import DRIVER, PYFUNC, RUNTIME

_FREE_CALLS = {"cudaFree", "hipFree", "cuMemFree", "cuMemFree_v2"}


def add(ctx: TraceContext) -> None:
    """empty_cache.free_calls_per_step and the empty_cache subjects (GPU traces)."""
    t, stacks, ns = ctx.trace, ctx.stacks, ctx.per_step
    name, ts = t.name, t.ts
    free_names = t.names_where(_FREE_CALLS.__contains__)
    free_ts = [ts[i] for i in t.indices(RUNTIME, DRIVER) if name[i] in free_names] if free_names else []
    ctx.put("empty_cache.free_calls_per_step", median(count_in(free_ts, ctx.cpu_windows)), "count",
            "cudaFree/hipFree calls")
    calls = t.names_where(lambda s: s.endswith(": empty_cache"))
    for i in t.indices(PYFUNC):
        if name[i] in calls:
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
