"""Compute efficiency: FLOPs per step from the matrix multiplications the trace recorded with their
shapes, the FLOP/s achieved, and the model FLOPs utilisation (MFU) against the device's peak.

FLOPs are counted as `torch.utils.flop_counter.FlopCounterMode` counts them: 2*M*K*N for
`aten::mm` and `aten::addmm` ([M, K] x [K, N]; the bias add is not counted), 2*B*M*K*N for
`aten::bmm` and `aten::baddbmm`, forward and backward alike (the backward's matmuls are in the trace
as `aten::mm`). Only those leaf operators are counted (`aten::linear` and `aten::matmul` call them, so
counting them too would count twice). One with a sparse operand (`torch.sparse.mm`: its recorded dims
are the dense product's, its work 2*nnz*N) is not counted, as the run's count leaves it out
(capture/probes/flops.py). A convolution's forward records its input and weight shapes
but not its strides and padding, so not its output size: it is counted from its backward
(`aten::convolution_backward`, whose grad_output is that output), 3x its forward (the forward and
its two gradients). Where convolutions ran without a backward, the FLOPs are given with those
counted (`compute.uncounted_convs_per_step`) and no FLOP/s or MFU is computed (it would be too low).

MFU = FLOPs per step / step time / peak FLOP/s, with the step time the run's median unprofiled step
where the trace comes from a run folder (the profiler slows the recorded steps), else the trace's.
The peak: a CPU run's measured matmul rate (`compute.peak_flops`, measured by the child at the end of
the run: a rate this CPU reaches, not a datasheet figure), else the datasheet peak of a known
accelerator for the dtype most of the FLOPs ran in (`PEAKS`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable

import msgspec

from perfdoctor.contracts.report import ComputeDoc, ComputeModuleDoc, SummaryDoc
from perfdoctor.facts.trace.context import TraceContext
from perfdoctor.trace.model import CPU_OP, PYFUNC

# Dense (no structured sparsity) peak TFLOP/s from the vendors' datasheets: (16-bit tensor, tf32, fp32),
# the one table of accelerator rates (the reference GPU below reads it too). NVIDIA: V100 SXM2, T4,
# A10, L4, A100 SXM, H100 SXM, H200 SXM, B200 (HGX B200, per GPU); AMD Instinct
# MI250X and MI300X (fp32 on the matrix cores). None where the datasheet gives no such figure.
PEAKS: tuple[tuple[str, tuple[float, float | None, float | None]], ...] = (
    ("H200", (989.0, 494.0, 67.0)),
    ("H100", (989.0, 494.0, 67.0)),
    ("B200", (2250.0, 1100.0, None)),
    ("A100", (312.0, 156.0, 19.5)),
    ("A10", (125.0, 62.5, 31.2)),
    ("L4", (121.0, 60.0, 30.3)),
    ("V100", (125.0, None, 15.7)),
    ("T4", (65.0, None, 8.1)),
    ("MI300X", (1307.4, 653.7, 163.4)),
    ("MI250X", (383.0, None, 95.7)),
)
_SIXTEEN = ("c10::BFloat16", "c10::Half", "BFloat16", "Half")

# The reference GPU a CPU run of a CUDA-targeting script is judged for (facts/trace/target_gpu.py): its
# datasheet rates are PEAKS' row (A100 SXM, NVIDIA A100 datasheet, dense: bf16/fp16 312, TF32 156,
# fp32 19.5 TFLOP/s; https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
# nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), the most common training GPU of the last years.
REFERENCE_GPU = "A100"
# The host time per launching op of an eager CUDA training step bound by its kernel launches (the
# aten ops no other aten op encloses: facts/trace/target_gpu.py): the lowest bare step / such ops
# per step of this project's launch-bound samples on an H200 (docs/gpu.md's bare steps over the ops
# of tests/data/traces/h200__*: pd007_fp32_without_amp 2.02 ms / 89 ops = 22.7 us, pd004 25.1 us,
# pd005 26.1 us; the others, whose steps also wait for data or Python, 44-94 us). Each op dispatches,
# records autograd and launches its kernels.
HOST_US_PER_OP = 23.0
# What a copy from pageable host memory to the GPU moves per second: the driver stages it through a
# pinned buffer, about half the link's pinned rate (PCIe 4.0 x16: about 25 GB/s pinned, 10-13 GB/s
# pageable in CUDA's bandwidthTest on A100 hosts); the low end.
H2D_PAGEABLE_BYTES_PER_S = 10e9


def _mm(dims: list) -> int:
    a, b = dims[0], dims[1]
    return 2 * a[0] * a[1] * b[1]


def _bmm(dims: list) -> int:
    a, b = dims[0], dims[1]
    return 2 * a[0] * a[1] * a[2] * b[2]


_FLOPS: dict[str, tuple[Callable[[list], int], int]] = {  # op -> (its FLOPs from the operands' dims, first operand)
    "aten::mm": (_mm, 0), "aten::addmm": (_mm, 1), "aten::bmm": (_bmm, 0), "aten::baddbmm": (_bmm, 1),
}
_CONV, _CONV_BACKWARD = "aten::convolution", "aten::convolution_backward"


def device_peak(name: str | None, dtype: str) -> tuple[float, str] | None:
    """(peak FLOP/s, where it comes from) of a known accelerator for `dtype` ("16-bit", "tf32", "fp32")."""
    if not name:
        return None
    upper = name.upper()
    for key, (half, tf32, fp32) in PEAKS:
        if key in upper and not (key == "A10" and "A100" in upper) and not (key == "L4" and "L40" in upper):
            peak = {"16-bit": half, "tf32": tf32, "fp32": fp32}[dtype]
            if peak is None:
                return None
            return peak * 1e12, f"{key} datasheet, dense {dtype}: {peak:g} TFLOP/s"
    return None


def _conv_backward(dims: list) -> int:
    """The forward FLOPs of the convolution whose backward has these operand dims: grad_output
    [N, C_out, *out] and weight [C_out, C_in / groups, *kernel], 2 * N * C_out * prod(out) * C_in / groups
    * prod(kernel), as FlopCounterMode counts a convolution."""
    out, weight = dims[0], dims[2]
    flops = 2
    for d in [*out, *weight[1:]]:
        flops *= d
    return flops


def _count(ctx: TraceContext) -> tuple[float, float] | None:
    """(FLOPs per step, their 16-bit share) from the trace's recorded matmul and convolution shapes;
    None where none were recorded or where convolutions leave the step's FLOPs unknown (then the count
    is a fact, with those convolutions not counted, and no rate follows). A convolution is counted from
    its backward (`aten::convolution_backward`, whose operands give the output size the forward's do
    not: strides and padding are not recorded): its forward and its two gradients, 3x the forward, as
    FlopCounterMode counts them; one that ran without a backward is not counted."""
    t = ctx.trace
    strings, name, kind = t.strings, t.name, t.kind
    total = sixteen = conv_total = 0
    counted = convs = backwards = 0
    for i in t.shapes:
        if kind[i] != CPU_OP:
            continue
        nm = strings[name[i]]
        spec = _FLOPS.get(nm)
        if spec is None and nm != _CONV_BACKWARD:
            convs += nm == _CONV
            continue
        ops = t.shape(i)
        if ops.sparse:
            continue  # a sparse operand (torch.sparse.mm's adjacency): not the dense product's FLOPs
        types, dims = ops.types, ops.dims
        try:
            flops = 3 * _conv_backward(dims) if spec is None else spec[0](dims[spec[1]:])
        except (IndexError, TypeError):
            continue  # shapes not recorded as expected: not counted
        if not isinstance(flops, int) or flops <= 0:
            continue
        total += flops
        if spec is None:
            conv_total += flops
            backwards += 1
        else:
            counted += 1
        first = 0 if spec is None else spec[1]
        if len(types) > first and types[first] in _SIXTEEN:
            sixteen += flops
    if not total:
        return None
    per_step = total / ctx.per_step
    uncounted = max(0, convs - backwards)
    left_out = f"; {uncounted // ctx.per_step} convolution(s) per step not counted (no backward gives their output size)" \
        if uncounted else ""
    with_convs = f" and {backwards // ctx.per_step} convolution(s) (from their backward: 3x the forward)" if backwards else ""
    ctx.put("compute.flops_per_step", per_step, "number",
            f"2*M*K*N over {counted // ctx.per_step} matmul(s) per step (mm, addmm, bmm, baddbmm; forward and backward)"
            + with_convs + left_out)
    if backwards:
        ctx.put("compute.conv_flops_per_step", conv_total / ctx.per_step, "number",
                "the convolutions' FLOPs from their backward's recorded shapes, forward and backward")
    if uncounted:  # the step's FLOPs are not known: no FLOP/s and no MFU, rather than a figure far too low
        ctx.put("compute.uncounted_convs_per_step", uncounted / ctx.per_step, "count",
                "convolutions per step whose FLOPs the trace does not give (no backward recorded their output size)")
        return None
    return per_step, sixteen / total


def add(ctx: TraceContext, summary: SummaryDoc) -> None:
    """compute.flops_per_step (the run's FlopCounterMode count where there is one, else the trace's
    matmul shapes), compute.achieved_flops and, where a peak is known, compute.mfu; the listed
    modules' achieved rates (`module_rates`) as the trace summary's `compute.modules` (the run's
    summary takes them, analysis.py)."""
    counted = ctx.facts.get("compute.flops_per_step")
    if counted is not None and counted.source == "run":
        share = ctx.facts.value("compute.sixteen_bit_share")
        found: tuple[float, float] | None = (float(counted.value), float(share) if isinstance(share, (int, float)) else 0.0)
    else:
        found = _count(ctx)
    rows = module_rates(ctx) if ctx.modules else None
    if found is not None:
        _rate(ctx, *found)
    if rows:
        summary.compute = ComputeDoc(modules=rows)


def _rate(ctx: TraceContext, per_step: float, sixteen_share: float) -> None:
    step_ms = ctx.run_step_ms if ctx.run_step_ms else ctx.facts.value("step.time_ms")
    if not step_ms:
        return
    achieved = per_step / (step_ms / 1000)
    which = "the run's median unprofiled step" if ctx.run_step_ms else "the trace's median step"
    ctx.put("compute.achieved_flops", achieved, "number", f"FLOPs per step / {which} ({step_ms:.3f} ms), per second")
    dtype = "16-bit" if sixteen_share >= 0.5 else "fp32"
    peak_fact = ctx.facts.value("compute.peak_flops")
    if isinstance(peak_fact, (int, float)) and peak_fact > 0:
        peak, source = float(peak_fact), "this CPU's measured fp32 matmul rate (compute.peak_flops)"
    else:
        dev = device_peak(ctx.facts.value("device.name"), dtype)
        if dev is None:
            return
        peak, source = dev
        ctx.put("compute.peak_flops", peak, "number", source)
    ctx.put("compute.mfu", achieved / peak, "ratio",
            f"MFU = FLOPs per step / step time / peak = {per_step:.4g} / {step_ms / 1000:.4g} s / {peak:.4g} FLOP/s; "
            f"peak: {source}")


MODULE_PREFIX = "nn.Module: "


def module_rates(ctx: TraceContext) -> list[ComputeModuleDoc]:
    """The run's listed modules (`ctx.modules`, facts/run/compute.py) with their forward's time per step
    in the trace and its achieved rate (forward FLOPs / forward time). A module's time: on a GPU trace
    the kernels launched inside its forward (torch.profiler's Python tracer's "nn.Module: Class_k" span),
    on a CPU trace the span itself. Modules the trace has no span for keep no time."""
    t = ctx.trace
    strings, name, ts, dur = t.strings, t.name, t.ts, t.dur
    wanted = {r.layer: r for r in ctx.modules if r.layer}
    spans: dict[str, list[tuple[float, float]]] = {}
    for i in t.indices(PYFUNC):
        nm = strings[name[i]]
        if nm.startswith(MODULE_PREFIX) and nm[len(MODULE_PREFIX):] in wanted:
            spans.setdefault(nm[len(MODULE_PREFIX):], []).append((ts[i], ts[i] + dur[i]))
    launched: list[tuple[float, float]] = []  # (launch time, the kernel's duration), by launch time
    if ctx.gpu:
        corr = t.corr
        for g in ctx.gpu_events:
            call = ctx.launches.get(corr[g])
            if call is not None:
                launched.append((ts[call], dur[g]))
        launched.sort()
    starts = [a for a, _ in launched]
    out = []
    for r in ctx.modules:
        row = msgspec.structs.replace(r)
        sp = spans.get(r.layer or "")
        if sp:
            if ctx.gpu:
                us = sum(launched[k][1] for a, b in sp for k in range(bisect_left(starts, a), bisect_right(starts, b)))
            else:
                us = sum(b - a for a, b in sp)
            ms = us / 1000 / ctx.per_step
            row.forward_ms = round(ms, 4)
            row.time_source = "GPU kernels launched in its forward" if ctx.gpu else "its forward's span on the CPU"
            if ms > 0 and row.forward_flops:
                row.achieved_flops = round(row.forward_flops / (ms / 1000), 1)
        out.append(row)
    return out
