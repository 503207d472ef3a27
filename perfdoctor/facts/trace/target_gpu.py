"""The GPU step a CPU run of a CUDA-targeting script would take on a reference GPU (`target_gpu.*`):
what PD007 judges such a run by (is the fp32 matmul and convolution math a material share of the
step on the GPU the script targets, or is that step bound by its kernel launches?), what PD002 projects
a loader's loading onto and what PD004's copies are priced against.

From what the run observed:
- the FLOPs of one real step, forward and backward, and their 16-bit share (`compute.flops_per_step`: FlopCounterMode's count
  of matmuls, convolutions and attention, facts/run/compute.py; else the trace's matmul and
  convolution shapes, facts/trace/flops.py, which leave out a convolution that ran without a backward,
  a momentum encoder's or an evaluation's: the math is then a lower bound), of them the convolutions'
  (`compute.conv_flops_per_step`);
- the aten ops per step no other aten op encloses, each of which launches one kernel or more on a
  GPU (not a DataLoader's own), with an optimizer step's ops counted once per operator
  (`target_gpu.ops_per_step`);
- how the source sets TF32 (`script.tf32_matmul`, `script.tf32_conv`, facts/static/tf32.py).

The estimate, for the reference GPU (facts/trace/flops.py `REFERENCE_GPU`, its datasheet rates in
`PEAKS`):
    math_ms   = the fp32 part of the FLOPs (1 - compute.sixteen_bit_share):
                conv FLOPs / conv rate + other FLOPs / matmul rate
                (conv rate: TF32 unless the source turns cuDNN's TF32 off, torch's default being on;
                 matmul rate: fp32 unless the source lets matmuls use TF32, torch's default being off)
    launch_ms = target_gpu.ops_per_step x HOST_US_PER_OP (the host's floor of an eager step)
    step_ms   = launch_ms + math_ms + the 16-bit FLOPs / the 16-bit rate
    share     = math_ms / step_ms
    amp_saving_ms = math_ms - the same FLOPs / the 16-bit rate
    sync_ms   = 2 x HOST_US_PER_OP: the least one blocking copy from pageable host memory (or one sync)
                costs such a step: the call's own host time, then the drained queue waits for the next
                launch; a copy's bytes add at H2D_PAGEABLE_BYTES_PER_S (h2d_bytes_per_ms). PD004 prices
                the step's copies of host-made tensors with them: its severity follows their share
The rates are datasheet peaks, which small matmuls do not reach: the math time is a lower bound, so
the share is too. The batch is the run's: where a CPU run shrank it, the GPU's FLOPs per step are
larger than counted (perfdoctor cannot know the batch the script would use on the GPU).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict

from perfdoctor.facts import registry
from perfdoctor.facts.model import Facts
from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.facts.trace.flops import H2D_PAGEABLE_BYTES_PER_S, HOST_US_PER_OP, REFERENCE_GPU, device_peak
from perfdoctor.facts.trace.intervals import count_in, outermost
from perfdoctor.stats import median
from perfdoctor.trace.model import CPU_OP, USER_ANN


def _rate(dtype: str) -> float:
    peak = device_peak(REFERENCE_GPU, dtype)
    assert peak is not None, f"PEAKS has no {dtype} rate for the reference GPU {REFERENCE_GPU}"
    return peak[0]


def gpu_ops_per_step(ctx: TraceContext) -> float | None:
    """The aten ops per step that no other aten op encloses (forward, backward, optimizer: the ops that
    launch a CUDA step's kernels; an autograd node's wrapper is not one), not those a DataLoader's
    `__next__` runs (its transforms stay on the host on a GPU too), those inside an optimizer
    step (`Optimizer.step#...`) once per operator and optimizer step: torch's optimizers loop over
    the parameters on a CPU and run each operator once over all of them in their foreach form, CUDA's
    default. None without steps."""
    t, windows = ctx.trace, ctx.cpu_windows
    if not windows:
        return None
    ts, dur, name = t.ts, t.dur, t.name
    aten = t.names_where(lambda s: s.startswith("aten::"))
    steps = t.names_where(lambda s: s.startswith("Optimizer.step#"))
    loading = t.names_where(lambda s: s.startswith("enumerate(DataLoader)"))
    spans = sorted((ts[i], ts[i] + dur[i]) for i in t.indices(CPU_OP, USER_ANN) if name[i] in steps)
    batches = sorted((ts[i], ts[i] + dur[i]) for i in t.indices(CPU_OP, USER_ANN) if name[i] in loading)
    starts = [a for a, _ in batches]
    by_track: dict[int, list[int]] = defaultdict(list)
    for i in t.indices(CPU_OP):
        if name[i] in aten:
            by_track[t.track[i]].append(i)
    outer = [i for lst in by_track.values() for i in outermost(lst, ts, dur)]
    times, seen = [], set()
    k = 0
    for i in sorted(outer, key=ts.__getitem__):
        j = bisect_right(starts, ts[i]) - 1
        if j >= 0 and ts[i] < batches[j][1]:
            continue  # the DataLoader's own work (a transform's ops): the host's, on a GPU too
        while k < len(spans) and spans[k][1] <= ts[i]:
            k += 1
        if k < len(spans) and spans[k][0] <= ts[i]:
            if (k, name[i]) in seen:
                continue  # the same operator over the next parameter: one foreach op on CUDA
            seen.add((k, name[i]))
        times.append(ts[i])
    return median(count_in(times, windows))


def batch_scale(facts: Facts) -> tuple[float, str]:
    """The script's own batch over this run's, for the training loader: a CPU run is often given a
    smaller batch (`--batch_size 8`) than the script uses on its GPU (`default=128`), and the estimate
    is for the GPU. 1 where the run's batch is the default, larger, or either is unknown."""
    best: tuple[float, str] = (1.0, "")
    for s in facts.of_kind("dataloader"):
        f = s.facts
        if f.get("dataloader.trains") is not None and f["dataloader.trains"].value is False:
            continue
        ran, default = f.get("dataloader.batch_size"), f.get("dataloader.default_batch_size")
        if ran is None or default is None or ran.source == "static":
            continue
        if isinstance(ran.value, int) and ran.value > 0 and isinstance(default.value, int) and default.value > ran.value:
            scale = default.value / ran.value
            if scale > best[0]:
                best = (scale, f"the script's batch of {default.value} (its default) over this run's {ran.value}: "
                               "the FLOPs per step scaled by it, the launches not")
    return best


def add(ctx: TraceContext) -> None:
    facts = ctx.facts
    if ctx.gpu or not registry.derive("run.cuda_on_cpu", facts.value):
        return  # a GPU run measures its step; a script that stays on the CPU is not judged for a GPU
    flops = facts.value("compute.flops_per_step")
    if not isinstance(flops, (int, float)) or flops <= 0:
        return
    ops = gpu_ops_per_step(ctx)
    if not ops:
        return
    convs = facts.value("compute.conv_flops_per_step")
    conv_flops = min(float(convs), float(flops)) if isinstance(convs, (int, float)) else 0.0
    scale, why = batch_scale(facts)
    if scale > 1:  # the GPU runs the script's own batch: its math scales with it, its launches do not
        flops, conv_flops = flops * scale, conv_flops * scale
        ctx.put("target_gpu.batch_scale", scale, "ratio", why)
    sixteen = facts.value("compute.sixteen_bit_share")
    fp32 = 1.0 - (min(1.0, max(0.0, float(sixteen))) if isinstance(sixteen, (int, float)) else 0.0)
    conv_dtype = "fp32" if facts.value("script.tf32_conv") is False else "tf32"
    mm_dtype = "tf32" if facts.value("script.tf32_matmul") is True else "fp32"
    half = _rate("16-bit")
    math_ms = fp32 * (conv_flops / _rate(conv_dtype) + (flops - conv_flops) / _rate(mm_dtype)) * 1000
    launch_ms = ops * HOST_US_PER_OP / 1000
    step_ms = launch_ms + math_ms + (1 - fp32) * flops / half * 1000
    ctx.put("target_gpu.reference", f"NVIDIA {REFERENCE_GPU} (datasheet, dense: 16-bit {half / 1e12:g}, "
            f"TF32 {_rate('tf32') / 1e12:g}, fp32 {_rate('fp32') / 1e12:g} TFLOP/s); {HOST_US_PER_OP:g} us of host "
            "time per op", "str", "the GPU a CPU run of a CUDA-targeting script is judged for")
    ctx.put("target_gpu.math_ms", math_ms, "ms",
            f"the fp32 part ({fp32:.0%}) of {flops:.4g} FLOPs per step ({conv_flops:.4g} in convolutions, at the "
            f"{conv_dtype} rate; the rest at the {mm_dtype} rate) on the reference GPU")
    ctx.put("target_gpu.ops_per_step", ops, "count", "aten ops per step no other aten op encloses, an optimizer "
            "step's once per operator")
    ctx.put("target_gpu.launch_ms", launch_ms, "ms", f"{ops:g} ops per step x {HOST_US_PER_OP:g} us")
    ctx.put("target_gpu.step_ms", step_ms, "ms", "launch floor + math (the 16-bit part at the 16-bit rate), on the "
            "reference GPU")
    ctx.put("target_gpu.math_share", math_ms / step_ms, "ratio", "fp32 math / the estimated GPU step")
    ctx.put("target_gpu.sync_ms", 2 * HOST_US_PER_OP / 1000, "ms",
            f"2 x {HOST_US_PER_OP:g} us: the call's host time, then the drained queue waits for the next launch")
    ctx.put("target_gpu.h2d_bytes_per_ms", H2D_PAGEABLE_BYTES_PER_S / 1000, "number",
            f"{H2D_PAGEABLE_BYTES_PER_S / 1e9:g} GB/s from pageable host memory")
    ctx.put("target_gpu.amp_saving_ms", max(0.0, math_ms - fp32 * flops / half * 1000), "ms",
            "the fp32 math less the same FLOPs at the reference GPU's 16-bit rate")
