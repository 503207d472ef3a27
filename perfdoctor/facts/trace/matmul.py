"""GEMM/convolution time per step and its fp32 share (no tensor cores): from kernel names on a GPU
trace, from the ops' recorded input types on a CPU trace. On a CPU trace the matmul ops nest
(`aten::linear` calls `aten::addmm`, `aten::conv2d` calls `aten::convolution`, which calls
`aten::_convolution`): only the outermost of each nest is counted, so its time is counted once."""

from __future__ import annotations

import re

from perfdoctor.facts.trace.context import COMM, TraceContext
from perfdoctor.trace.model import CPU_OP, KERNEL

_MM = re.compile(r"gemm|gemv|conv|xmma|cutlass|884|1688|16816|matmul|cublas|xdlops|mfma|wgrad|dgrad|fprop", re.I)
_TENSOR_CORE = re.compile(r"884|1688|16816|xmma|hmma|tensorop|bf16|fp16|f16|tf32|h\d{3,4}gemm|i8816|wmma", re.I)
_FP32 = re.compile(r"sgemm|scudnn|convolve_sgemm|gemv2T|gemmSN|gemmk1|f32|fp32|float", re.I)
_CPU_MM = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
           "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution")


def add(ctx: TraceContext) -> None:
    """matmul.ms and matmul.fp32_share."""
    t = ctx.trace
    strings, name, dur = t.strings, t.name, t.dur
    mm = fp32 = 0.0
    if ctx.gpu:
        cache: dict[int, tuple[bool, bool]] = {}
        for i in ctx.gpu_events:
            if t.kind[i] != KERNEL:
                continue
            c = cache.get(name[i])
            if c is None:
                nm = strings[name[i]]
                is_mm = bool(_MM.search(nm)) and not COMM.search(nm)
                c = cache[name[i]] = (is_mm, is_mm and bool(_FP32.search(nm)) and not _TENSOR_CORE.search(nm))
            if c[0]:
                mm += dur[i]
                if c[1]:
                    fp32 += dur[i]
    else:  # CPU trace: the ops' recorded input types, each outermost op once
        ops = sorted((t.track[i], t.ts[i], -dur[i], i) for i in t.shapes
                     if strings[name[i]] in _CPU_MM and t.kind[i] == CPU_OP)
        track, end = None, -1.0
        for tr, ts, _, i in ops:
            if tr == track and ts < end:
                continue  # inside an op counted already (aten::linear calls aten::addmm, conv2d convolution)
            track, end = tr, ts + dur[i]
            types = t.shape(i)[0]
            mm += dur[i]
            if types and types[0] == "float":
                fp32 += dur[i]
    if mm > 0:
        ctx.put("matmul.ms", mm / 1000 / ctx.per_step, "ms", "GEMM/conv time per step")
        ctx.put("matmul.fp32_share", fp32 / mm, "ratio", "fp32 (no tensor core) share of GEMM/conv time")
