"""steps.json's memory at step ends -> `memory.*` (peak, total, free, growth per step, steps to an
out-of-memory error), from one source for the whole run: CUDA memory per device where the script
used CUDA, else the process RSS. Hands the growth on to the loss holders (`ctx.growth`)."""

from __future__ import annotations

import msgspec

from perfdoctor.facts.run.context import RunContext, span


def _slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and R^2."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return 0.0, 0.0
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    return sxy / sxx, sxy * sxy / (sxx * syy)


def memory_growth(steady: list[dict]) -> float | None:
    """Bytes per step when memory grows clearly and linearly over the steady steps, else None."""
    pts = [(s["i"], s["mem_bytes"]) for s in steady if s.get("mem_bytes") is not None]
    if len(pts) < 8:
        return None
    slope, r2 = _slope([p[0] for p in pts], [p[1] for p in pts])
    total = slope * (pts[-1][0] - pts[0][0])
    if slope > 0 and r2 >= 0.7 and total >= 1 << 20:
        return slope
    return None


def add(ctx: RunContext) -> None:
    """The memory facts, named in each fact's detail with the steps it read: CUDA memory per device
    where the script used CUDA (each device's allocated bytes at step ends, its peak within each
    step), else the process RSS. The device reported is the one that grows (or peaks) most; sets
    `ctx.growth`, the growth per step, None if none is clear. The RSS peak leaves out the steps the
    profiler held (`ctx.held`: its warm-up and recorded steps and the step that carries the trace
    export): their RSS holds the profiler's event buffers, tens of MB that vary from run to run and
    are not the script's (CUDA memory does not)."""
    ctx.growth = _memory(ctx)


def _memory(ctx: RunContext) -> float | None:
    facts, env, steady, held = ctx.facts, ctx.env, ctx.steady, ctx.held
    by_dev: dict[int, list[tuple[int, int, int]]] = {}  # device -> (step, allocated, peak)
    for st in ctx.run_steps:
        for c in st.cuda_mem or []:
            by_dev.setdefault(c.device, []).append((st.i, c.allocated, c.peak))
    steady_i = {x["i"] for x in steady}
    if not by_dev:
        rows = [(st.i, st.mem_bytes) for st in ctx.run_steps if st.mem_bytes is not None]
        rows = [r for r in rows if r[0] not in held] or rows
        if rows:
            facts.add("memory.peak_bytes", max(m for _, m in rows), "bytes",
                      detail=f"max process RSS at step ends ({span([i for i, _ in rows])})")
        facts.add("memory.total_bytes", env.total_memory_bytes, "bytes", "machine")
        free = None if env.free_memory_bytes is msgspec.UNSET else env.free_memory_bytes
        facts.add("memory.free_bytes", free, "bytes", "machine", "free at the end of the run")
        pts = [x for x in steady if x.get("mem_bytes") is not None]
        growth = memory_growth(pts)
        if growth is not None:
            facts.add("memory.growth_bytes_per_step", growth, "bytes", detail="least-squares slope of process RSS "
                      f"over {len(steady)} steady steps ({span([x['i'] for x in pts])})")
            if free:
                facts.add("memory.steps_to_oom", int(free / growth), "count", detail="free memory at the end / growth")
        return growth
    info = {d.index: d for d in env.devices or []}
    peak_dev = max(by_dev, key=lambda d: max(r[2] for r in by_dev[d]))
    peak_rows = by_dev[peak_dev]
    facts.add("memory.peak_bytes", max(r[2] for r in peak_rows), "bytes",
              detail=f"highest CUDA memory allocated within a step (max_memory_allocated, reset every step) on "
                     f"cuda:{peak_dev}, {span([r[0] for r in peak_rows])}")
    best: tuple[int, float, list[int]] | None = None
    for d, dev_rows in by_dev.items():
        pts = [{"i": i, "mem_bytes": a} for i, a, _ in dev_rows if i in steady_i]
        g = memory_growth(pts)
        if g is not None and (best is None or g > best[1]):
            best = (d, g, [x["i"] for x in pts])
    dev = best[0] if best is not None else peak_dev
    d_info = info.get(dev)
    total = d_info.total_memory_bytes if d_info is not None else env.device_memory_bytes
    free = d_info.free_memory_bytes if d_info is not None else None
    facts.add("memory.total_bytes", total, "bytes", "machine", f"cuda:{dev}")
    facts.add("memory.free_bytes", free, "bytes", "machine", f"free on cuda:{dev} at the end of the run")
    if best is None:
        return None
    facts.add("memory.growth_bytes_per_step", best[1], "bytes",
              detail=f"least-squares slope of CUDA memory allocated at step ends on cuda:{dev} over "
                     f"{len(best[2])} steady steps ({span(best[2])})")
    if free:
        facts.add("memory.steps_to_oom", int(free / best[1]), "count",
                  detail=f"free memory on cuda:{dev} at the end / growth")
    return best[1]
