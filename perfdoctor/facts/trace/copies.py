"""Host-to-device copies per step (pageable ones apart), and tensors made on the CPU only to be
copied to the GPU from the same line (`cpu_to_device` subjects)."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from typing import Any

from perfdoctor.facts.trace.context import SRC, TraceContext
from perfdoctor.facts.trace.intervals import count_in
from perfdoctor.facts.trace.stacks import location
from perfdoctor.stats import median
from perfdoctor.trace.model import CPU_OP, MEMCPY, RUNTIME

_FACTORIES = {"aten::tensor", "aten::randn", "aten::rand", "aten::zeros", "aten::ones", "aten::arange", "aten::full",
              "aten::empty", "aten::randint", "aten::from_numpy", "aten::linspace", "aten::eye", "aten::scalar_tensor",
              "aten::lift_fresh", "aten::as_tensor"}


def add(ctx: TraceContext) -> None:
    """copies.h2d_* facts (GPU traces; a copy counts in the step that launched it) and the
    cpu_to_device subjects."""
    t, windows, launches, ns = ctx.trace, ctx.cpu_windows, ctx.launches, ctx.per_step
    name, strings, ts, dur = t.name, t.strings, t.ts, t.dur
    h2d, h2d_pageable, h2d_ms, h2d_pg_ms, h2d_pg_host_ms = [], [], 0.0, 0.0, 0.0
    pinned_calls: list[int] = []  # the runtime calls that launched copies from pinned memory
    htod = t.names_where(lambda s: "HtoD" in s)
    for i in t.indices(MEMCPY):
        if name[i] in htod:
            nm = strings[name[i]]
            r = launches.get(t.corr[i])
            when = ts[r] if r is not None else ts[i]
            h2d.append(when)
            h2d_ms += dur[i]
            if "Pageable" in nm:
                h2d_pageable.append(when)
                h2d_pg_ms += dur[i]
                h2d_pg_host_ms += dur[r] if r is not None else dur[i]  # the CPU waits in the call throughout
            elif "Pinned" in nm and r is not None:
                pinned_calls.append(r)
    ctx.put("copies.h2d_per_step", median(count_in(h2d, windows)), "count")
    ctx.put("copies.h2d_pageable_per_step", median(count_in(h2d_pageable, windows)), "count")
    ctx.put("copies.h2d_ms", h2d_ms / 1000 / ns, "ms")
    ctx.put("copies.h2d_pageable_ms", h2d_pg_ms / 1000 / ns, "ms")
    if h2d_pageable:
        ctx.put("copies.h2d_pageable_host_ms", h2d_pg_host_ms / 1000 / ns, "ms")
    if pinned_calls:
        _pinned_sync(ctx, pinned_calls)
    _cpu_to_device(ctx, htod)


_SYNCS = {"cudaStreamSynchronize", "hipStreamSynchronize", "cudaDeviceSynchronize", "hipDeviceSynchronize"}


def _pinned_sync(ctx: TraceContext, pinned_calls: list[int]) -> None:
    """copies.h2d_pinned_sync_ms: the time the CPU waited in the stream syncs that follow copies from
    pinned memory (`.to(device)` without non_blocking: PyTorch queues the copy, then synchronizes).
    `pinned_calls`: the runtime calls that launched those copies."""
    t, ns = ctx.trace, ctx.per_step
    calls: dict[int, list[int]] = defaultdict(list)  # CPU track -> its runtime calls, in time order
    for i in t.indices(RUNTIME):
        calls[t.track[i]].append(i)
    for v in calls.values():
        v.sort(key=t.ts.__getitem__)
    starts = {k: [t.ts[i] for i in v] for k, v in calls.items()}
    syncs = t.names_where(_SYNCS.__contains__)
    waited, found = 0.0, False
    for r in pinned_calls:
        on = calls[t.track[r]]
        k = bisect_right(starts[t.track[r]], t.ts[r])  # the call right after the copy's own
        if k < len(on) and t.name[on[k]] in syncs:
            waited += t.dur[on[k]]
            found = True
    if found:
        ctx.put("copies.h2d_pinned_sync_ms", waited / 1000 / ns, "ms")


def _cpu_to_device(ctx: TraceContext, htod: set[int]) -> None:
    """A tensor made by a CPU factory op, then copied HtoD from the same python frame. The factory
    must be the user's own call (a direct frame): the profiler names a frame by its function, not its
    line, so a library's factory inside that function (AdamW's `torch.tensor` step counts under
    `optimizer.step()`) would otherwise pair with the batch's `.to(device)` beside it. Only a factory op
    the Python call made itself (no op around it) that launched no GPU work made a host tensor:
    `torch.randn(shape, device="cuda")` launches its fill kernel."""
    t, stacks, launches, ns = ctx.trace, ctx.stacks, ctx.launches, ctx.per_step
    name, strings = t.name, t.strings
    factory_frames: dict[Any, str] = {}
    factories = t.names_where(_FACTORIES.__contains__)
    cpu_ops = t.indices(CPU_OP)
    cpu_ops_by_track: dict[int, list[int]] = defaultdict(list)
    for i in cpu_ops:
        cpu_ops_by_track[t.track[i]].append(i)
    launched: dict[int, list[float]] = defaultdict(list)  # per CPU track, when it launched GPU work
    for call in launches.values():
        launched[t.track[call]].append(t.ts[call])
    for v in launched.values():
        v.sort()
    for track, ops in cpu_ops_by_track.items():
        top_end = float("-inf")
        for i in sorted(ops, key=lambda j: (t.ts[j], -t.dur[j])):
            if t.ts[i] < top_end:  # inside another op: `aten::to`'s own empty, `randn`'s
                continue
            top_end = t.ts[i] + t.dur[i]
            if name[i] not in factories:
                continue
            lt = launched.get(track, [])
            k = bisect_right(lt, t.ts[i])  # a factory that launched a kernel made its tensor on the GPU
            if k > 0 and lt[k - 1] == t.ts[i] or k < len(lt) and lt[k] <= top_end:
                continue
            u = stacks.frame(i, direct=True)
            if u:
                factory_frames[(u[1], u[0][:2]) if u[1] >= 0 else u[0][:2]] = strings[name[i]]
    if not factory_frames:
        return
    op_starts = {k: [t.ts[i] for i in v] for k, v in cpu_ops_by_track.items()}  # already in ts order
    for i in t.indices(MEMCPY):
        if name[i] not in htod:
            continue
        r = launches.get(t.corr[i])
        if r is None:
            continue
        u = stacks.frame(r) if t.call_stack.get(r) is not None or stacks.by_track else None
        if u is None:  # legacy: the stack is on the innermost cpu op around the runtime call
            ops = cpu_ops_by_track.get(t.track[r], [])
            k = bisect_right(op_starts.get(t.track[r], []), t.ts[r]) - 1
            while k >= 0 and u is None and k > len(ops) - 10_000_000:
                j = ops[k]
                if t.ts[r] <= t.ts[j] + t.dur[j] and j in t.call_stack:
                    u = stacks.frame(j)
                k -= 1
                if k >= 0 and t.ts[r] - t.ts[ops[k]] > 1e6:  # no op runs longer than a second here
                    break
        if u is None:
            continue
        fk = (u[1], u[0][:2]) if u[1] >= 0 else u[0][:2]
        if fk in factory_frames:
            key, loc = location(u[0])
            s = ctx.facts.subject("cpu_to_device", key)
            if loc not in s.locations:
                s.locations.append(loc)
            s.add("factory", factory_frames[fk], "", SRC)
            s.add("target", "cuda", "", SRC)
            s.add("in_loop", True, "", SRC)
            prev = s.facts.get("cpu_to_device.ms")
            s.add("ms", (prev.value if prev else 0.0) + t.dur[i] / 1000 / ns, "ms", SRC)
