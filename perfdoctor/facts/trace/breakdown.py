"""Step time and where it goes: every span of the trace (kernels, copies, runtime calls, data
loading, CPU ops...) in one category, each microsecond counted once, in priority order."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from operator import itemgetter

from perfdoctor.contracts.report import SummaryDoc
from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.facts.trace.intervals import merge, per_window, subtract
from perfdoctor.stats import breakdown, breakdown_rows, median, quantile, step_series, step_time_summary
from perfdoctor.trace.model import CPU_OP, DRIVER, KERNEL, MEMCPY, MEMSET, PYFUNC, RUNTIME, USER_ANN, Trace

# the categories in priority order (a microsecond in two categories counts for the first), "other" last
GPU_ORDER = ("gpu kernel", "memcpy", "memset", "communication", "runtime", "data loading", "cpu ops", "other")
CPU_ORDER = ("data loading", "optimizer", "backward", "forward", "cpu ops", "other")
_FACT_OF = {"gpu kernel": "step.gpu_kernel_ms", "memcpy": "step.memcpy_ms", "memset": "step.memset_ms",
            "communication": "step.comm_ms", "runtime": "step.runtime_ms", "data loading": "step.data_ms",
            "cpu ops": "step.cpu_ops_ms", "other": "step.other_ms", "forward": "step.forward_ms",
            "backward": "step.backward_ms", "optimizer": "step.optimizer_ms"}


@dataclass
class Breakdown:
    summary: SummaryDoc  # steps_observed, steps_profiled, step_clock, step_time_ms, breakdown, step_series
    data_loading: list[tuple[float, float]]  # the DataLoader's spans (µs), for the dataloader facts
    gpu_parts: dict[str, float]  # the GPU's categories, median ms per step (GPU traces)


def add(ctx: TraceContext) -> Breakdown:
    """The run.* and step.* facts; the summary's step statistics and breakdown (per-category
    medians scaled to add up to the median step, `perfdoctor.stats.breakdown`). With several GPUs
    in the timeline, the GPU categories are the busiest device's (`ctx.main_device`): merged, two
    devices busy at once would count once and the idle time would look smaller than it is."""
    t, put, windows, step_ms, nsteps = ctx.trace, ctx.put, ctx.windows, ctx.step_ms, ctx.nsteps
    gpu = ctx.gpu
    cats = _spans_by_category(ctx)
    order = GPU_ORDER if gpu else CPU_ORDER
    covered: list[list[float]] = []
    parts: dict[str, float] = {}  # category -> median ms per step
    kernel_ms: tuple[float, ...] = ()  # the GPU kernels' ms at each step: a rank's compute (facts.ranks)
    for c in order[:-1]:
        if gpu and c in ("optimizer", "backward", "forward"):
            continue
        own = subtract(merge(cats.get(c, [])), covered)
        at_step = per_window(own, windows)
        parts[c] = (median(at_step) or 0.0) / 1000
        if c == "gpu kernel":
            kernel_ms = tuple(v / 1000 for v in at_step)
        # own and covered are disjoint: sorting the two runs by start (linear for timsort) keeps covered
        # disjoint and sorted, as subtract needs (touching intervals need not be joined)
        covered = sorted(covered + own, key=itemgetter(0))
    step = median(step_ms) or 0.0
    split = breakdown(parts, step)

    clock = {"profiler-step": "profiler-step", "annotation": "annotation"}.get(t.step_source, "whole-run")
    put("run.steps_profiled", nsteps, "count", f"steps in the trace ({t.step_source})")
    put("run.step_clock", clock)
    if step_ms:
        put("step.time_ms", step, "ms", "median step (CPU span + the GPU work it launched)")
        put("step.time_p90_ms", quantile(step_ms, 0.9), "ms")
        put("step.profiled_time_ms", step, "ms", "median profiled step (CPU span + the GPU work it launched)")
    for c, v in split.items():
        put(_FACT_OF[c], v, "ms", "median per step, each microsecond counted once in priority order",
            per_step=kernel_ms if c == "gpu kernel" else ())

    summary = SummaryDoc(
        steps_observed=nsteps + (1 if t.dropped_last_step else 0),
        steps_profiled=nsteps,
        step_clock=clock,
        step_time_ms=step_time_summary(step_ms),
        breakdown=breakdown_rows(split, step),
        # every step of a trace is profiled and every one counts in the statistics
        step_series=step_series(step_ms, list(range(1, nsteps + 1)), None),
    )
    return Breakdown(summary, cats.get("data loading", []),
                     {c: parts[c] for c in GPU_ORDER[:4] if c in parts} if gpu else {})


def _spans_by_category(ctx: TraceContext) -> dict[str, list[tuple[float, float]]]:
    """The spans (µs) of each category, kind by kind; CPU-side names classified once each."""
    t, is_comm = ctx.trace, ctx.is_comm
    name, ts, dur, strings, track, device = t.name, t.ts, t.dur, t.strings, t.track, t.device
    cats: dict[str, list[tuple[float, float]]] = defaultdict(list)
    main_track = _main_track(t)

    def spans(idx: list[int]) -> list[tuple[float, float]]:
        return [(ts[i], ts[i] + dur[i]) for i in idx]

    def on_main(idx: list[int]) -> list[int]:
        return idx if len(ctx.devices) < 2 else [i for i in idx if device[i] == ctx.main_device]

    kernels = on_main(t.indices(KERNEL))
    cats["communication"] = spans([i for i in kernels if is_comm(name[i])])
    cats["gpu kernel"] = spans([i for i in kernels if not is_comm(name[i])])
    cats["memcpy"] = spans(on_main(t.indices(MEMCPY)))
    cats["memset"] = spans(on_main(t.indices(MEMSET)))
    cats["runtime"] = spans(t.indices(RUNTIME, DRIVER))
    for k in (USER_ANN, CPU_OP, PYFUNC):
        idx = t.indices(k)
        keys = [name[i] * 2 + (track[i] == main_track) for i in idx]  # name index * 2 + (on the main track)
        cat_of = {key: _cpu_category(k, strings[key >> 1], bool(key & 1)) for key in dict.fromkeys(keys)}
        found = [c for c in dict.fromkeys(cat_of.values()) if c is not None]
        if len(found) == 1 and len(cat_of) == 1:
            cats[found[0]] += spans(idx)
        elif found:
            of = [cat_of[key] for key in keys]
            for c in found:
                cats[c] += [(ts[i], ts[i] + dur[i]) for i, ci in zip(idx, of) if ci == c]
    return cats


def _cpu_category(k: int, nm: str, on_main: bool) -> str | None:
    """The breakdown category of a CPU-side event (annotation, op, python function), or None."""
    if nm.startswith("ProfilerStep#"):
        return None
    if nm.startswith("enumerate(DataLoader)"):
        return "data loading"
    if nm.startswith(("Optimizer.step#", "Optimizer.zero_grad#")) or nm == "## optimizer ##":
        return "optimizer"
    if nm.startswith("autograd::engine::evaluate_function") or nm == "## backward ##" or (
            k == CPU_OP and not on_main and nm.startswith("autograd::")):
        return "backward"
    if nm == "## forward ##" or (k == PYFUNC and nm.startswith("nn.Module:") and on_main):
        return "forward"
    return "cpu ops" if k == CPU_OP else None


def _main_track(t: Trace) -> int:
    """The CPU track with the ProfilerStep (else the most CPU ops)."""
    ops = t.indices(CPU_OP, USER_ANN)
    steps = t.names_where(lambda s: s.startswith("ProfilerStep#"))
    name, track = t.name, t.track
    first = next((i for i in ops if name[i] in steps), None)
    if first is not None:
        return track[first]
    counts = Counter(track[i] for i in ops)  # ties: the track seen first, as max() keeps the first
    return max(counts, key=counts.__getitem__) if counts else -1
