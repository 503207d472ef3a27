"""steps.json's memory at step ends -> `memory.*` (peak, total, free, growth per step, steps to an
out-of-memory error), from one source for the whole run: CUDA memory per device where the script
used CUDA, else the process RSS. Hands the growth on to the loss holders (`ctx.growth`)."""

from __future__ import annotations

import math

import msgspec

from perfdoctor.contracts.report import MemoryDoc, SummaryDoc
from perfdoctor.facts.model import Facts
from perfdoctor.facts.run.context import RunContext, span

T90 = 1.645  # the slope's 90 % interval: +-T90 standard errors (normal; the fit uses 8 steps or more)


def _slope(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares slope, R^2 and the slope's standard error."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return 0.0, 0.0, 0.0
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    resid = max(0.0, syy - slope * sxy)  # the residual sum of squares
    se = math.sqrt(resid / (n - 2) / sxx) if n > 2 else 0.0
    return slope, sxy * sxy / (sxx * syy), se


def growth_fit(steady: list[dict]) -> tuple[float, float, float] | None:
    """(bytes per step, and its 90 % interval's low and high ends) by a least-squares line through the
    memory at the steady steps' ends; None with fewer than 8 steps."""
    pts = [(s["i"], s["mem_bytes"]) for s in steady if s.get("mem_bytes") is not None]
    if len(pts) < 8:
        return None
    slope, _, se = _slope([p[0] for p in pts], [p[1] for p in pts])
    return slope, slope - T90 * se, slope + T90 * se


def memory_growth(steady: list[dict]) -> float | None:
    """Bytes per step when memory grows clearly and linearly over the steady steps, else None."""
    pts = [(s["i"], s["mem_bytes"]) for s in steady if s.get("mem_bytes") is not None]
    if len(pts) < 8:
        return None
    slope, r2, _ = _slope([p[0] for p in pts], [p[1] for p in pts])
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
    are not the script's (CUDA memory does not); the RSS growth leaves them out for the same reason."""
    ctx.growth = _memory(ctx)
    _objects(ctx)
    _summary(ctx)


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
        # the RSS of the steps the profiler held grows with its event buffers (a 5-step window of a small
        # model: 0.2-0.4 MB a step), which is no leak of the script's: their RSS is left out here too
        pts = [x for x in steady if x.get("mem_bytes") is not None and x["i"] not in held]
        growth = memory_growth(pts)
        if growth is not None:
            facts.add("memory.growth_bytes_per_step", growth, "bytes", detail="least-squares slope of process RSS "
                      f"over {len(pts)} steady steps the profiler did not hold ({span([x['i'] for x in pts])})")
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


def _on_device(by_key: dict[str, int], device_type: str) -> int:
    return sum(v for k, v in by_key.items() if k.endswith(f"@{device_type}"))


def _objects(ctx: RunContext) -> None:
    """`memory.params_bytes`, `grads_bytes`, `optimizer_state_bytes`: the optimizers' parameters, their
    gradients and the optimizers' state, summed over every optimizer the run stepped, on the device
    type the memory facts are about; on CUDA, what the step's peak holds beyond them
    (`memory.activations_bytes`: activations and temporaries), the headroom to the device's capacity,
    and the batch that would fit at the activations measured per sample (an estimate)."""
    found = ctx.probes.memory_objects
    if not found:
        return
    dev = "cuda" if any(st.cuda_mem for st in ctx.run_steps) else "cpu"
    parts = {}
    for name, attr in (("memory.params_bytes", "params_bytes"), ("memory.grads_bytes", "grads_bytes"),
                       ("memory.optimizer_state_bytes", "state_bytes")):
        total = sum(_on_device(getattr(o, attr), dev) for o in found)
        by_dtype: dict[str, int] = {}
        for o in found:
            for k, v in getattr(o, attr).items():
                if k.endswith(f"@{dev}"):
                    by_dtype[k.split("@")[0]] = by_dtype.get(k.split("@")[0], 0) + v
        parts[name] = total
        ctx.facts.add(name, total, "bytes", detail=", ".join(f"{k} {v}" for k, v in sorted(by_dtype.items()))
                      + f" on {dev}, each storage once, read at the end of each optimizer's step "
                      f"{found[0].step} ({', '.join(o.optimizer for o in found)})")
    peak = ctx.facts.value("memory.peak_bytes")
    total_mem = ctx.facts.value("memory.total_bytes")
    static = sum(parts.values())
    if isinstance(peak, (int, float)) and isinstance(total_mem, (int, float)) and total_mem > 0:
        ctx.facts.add("memory.headroom_bytes", max(0, int(total_mem - peak)), "bytes",
                      detail="the device's (or, on the CPU, the machine's) memory less the peak")
    if dev != "cuda" or not isinstance(peak, (int, float)):
        return  # the RSS holds the interpreter and torch too: activations cannot be told apart there
    act = int(peak - static)
    if act <= 0:
        return
    ctx.facts.add("memory.activations_bytes", act, "bytes",
                  detail="the peak within a step less parameters, gradients and optimizer state: the "
                         "activations kept for backward and the temporaries")
    batch = _batch(ctx)
    if batch and isinstance(total_mem, (int, float)):
        per_sample = act / batch
        fits = int((total_mem - static) / per_sample) if per_sample > 0 else None
        if fits:
            ctx.facts.add("memory.batch_that_fits", fits, "count",
                          detail=f"an estimate: (device memory - parameters, gradients and optimizer state) / "
                                 f"{per_sample / 2**20:.1f} MiB of activations per sample at batch {int(batch)}; "
                                 f"the allocator's fragmentation makes the true limit lower")


def _batch(ctx: RunContext) -> int | None:
    """The batch size of the first loader that fed the steps, None where unknown."""
    fed = [d for d in ctx.probes.dataloaders if d.batches]
    batch = fed[0].kwargs.batch_size if fed else None
    return int(batch) if isinstance(batch, (int, float)) and batch > 0 else None


def cpu_estimates(facts: Facts, summary: SummaryDoc) -> None:
    """A CPU run whose trace recorded the allocator (profile_memory), after the trace's facts: the
    activations and temporaries are the allocator's within-step peak above the step's start
    (`memory.step_transient_bytes`: the RSS cannot tell them apart), a part of the peak like the others,
    and the batch that would fit in the headroom left (the machine's RAM, or the cgroup's limit, less
    the peak RSS) at that much per sample: an estimate."""
    mem = summary.memory
    act = facts.value("memory.step_transient_bytes")
    if not isinstance(mem, MemoryDoc) or mem.source != "process RSS" or not isinstance(act, (int, float)) or act <= 0:
        return
    facts.add("memory.activations_bytes", int(act), "bytes", "trace",
              "the allocator's highest total within a step above its total at the step's start (median over the "
              "recorded steps): activations kept for backward and temporaries")
    summary.memory = msgspec.structs.replace(mem, parts={**mem.parts, "activations": int(act)})
    batch, headroom = mem.batch, facts.value("memory.headroom_bytes")
    if isinstance(batch, int) and batch > 0 and isinstance(headroom, (int, float)):
        per_sample = act / batch
        facts.add("memory.batch_that_fits", int(batch + headroom / per_sample), "count", "trace",
                  f"an estimate: batch {batch} + (the machine's memory (or cgroup limit) less the peak RSS) / "
                  f"{per_sample / 2**20:.2f} MiB of activations and temporaries per sample; the C heap's "
                  "fragmentation and the loader's prefetched batches make the true limit lower")


def _summary(ctx: RunContext) -> None:
    """The summary's `memory`: the memory at each step's end (CUDA allocated on the device the facts
    are about, else the process RSS), the linear growth over the steady steps with its 90 % interval,
    and the peak's parts."""
    cuda = any(st.cuda_mem for st in ctx.run_steps)
    series: list[float | None] = []
    for st in ctx.run_steps:
        if cuda:
            series.append(max((c.allocated for c in st.cuda_mem or []), default=None))
        else:
            series.append(st.mem_bytes)
    if sum(v is not None for v in series) < 2:
        return
    steady = [{"i": x["i"], "mem_bytes": series[x["i"] - 1]} for x in ctx.steady if 0 < x["i"] <= len(series)]
    fit = growth_fit(steady)
    value = ctx.facts.value
    parts = {k: value(f"memory.{k}_bytes") for k in ("params", "grads", "optimizer_state", "activations")}
    devices: list[dict[str, int | None]] = []
    if cuda:
        info = {d.index: d for d in ctx.env.devices or []}
        peaks: dict[int, int] = {}
        for st in ctx.run_steps:
            for c in st.cuda_mem or []:
                peaks[c.device] = max(peaks.get(c.device, 0), c.peak)
        for d, pk in sorted(peaks.items()):
            tot = info[d].total_memory_bytes if d in info else None
            devices.append({"device": d, "peak_bytes": pk, "total_bytes": tot,
                            "headroom_bytes": None if tot is None else max(0, tot - pk)})
    ctx.summary.memory = MemoryDoc(
        source="cuda allocated" if cuda else "process RSS", bytes=series, batch=_batch(ctx),
        growth_bytes_per_step=None if fit is None else round(fit[0], 1),
        growth_interval=None if fit is None else [round(fit[1], 1), round(fit[2], 1)],
        peak_bytes=value("memory.peak_bytes"), total_bytes=value("memory.total_bytes"),
        parts={k: v for k, v in parts.items() if isinstance(v, (int, float))},
    )
    if devices:
        ctx.summary.memory.devices = devices
