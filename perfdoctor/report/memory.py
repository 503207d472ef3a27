"""The summary's memory (facts/run/memory.py `_summary`) in one line, the same in the text, Markdown and
HTML reports. No rich here: the machine formats import it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfdoctor.contracts.report import ComputeDoc, MemoryDoc


def _mib(b: float) -> str:
    return f"{b / 2**20:,.1f} MiB"


def memory_line(mem: MemoryDoc) -> str:
    """The summary's memory in one line: its source, first and last value, the growth per step with
    its interval, the peak's parts where known. Shared by the text, Markdown and HTML reports."""
    series = [v for v in mem.bytes if v is not None]
    out = f"{mem.source} {_mib(series[0])} -> {_mib(series[-1])}" if series else ""
    g, ci = mem.growth_bytes_per_step, mem.growth_interval
    if g is not None and ci:
        out += f", {'+' if g >= 0 else ''}{_mib(g)}/step over the steady steps (90% interval {_mib(ci[0])}..{_mib(ci[1])})"
    if mem.parts:
        out += "; peak: " + ", ".join(f"{k.replace('_', ' ')} {_mib(v)}" for k, v in mem.parts.items())
        if mem.peak_bytes:
            out += f" of {_mib(mem.peak_bytes)}"
    return out


def _si(v: float, unit: str) -> str:
    for div, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:,.3g} {prefix}{unit}"
    return f"{v:,.3g} {unit}"


def compute_line(value: Callable[[str], Any], compute: ComputeDoc | None = None) -> str | None:
    """The compute facts in one line, the MFU with its formula and denominator: `value(name)` reads a
    fact's value; `compute`, the summary's, says what counted the FLOPs. None where none were counted."""
    flops = value("compute.flops_per_step")
    if not isinstance(flops, (int, float)):
        return None
    source = (compute.source if compute is not None else "") or "matmul shapes in the trace"
    out = f"{_si(flops, 'FLOP')} per step ({source})"
    convs = value("compute.uncounted_convs_per_step")
    if isinstance(convs, (int, float)) and convs:
        return out + f"; {convs:g} convolution(s) per step not counted, so no FLOP/s or MFU"
    achieved = value("compute.achieved_flops")
    if isinstance(achieved, (int, float)):
        out += f", {_si(achieved, 'FLOP/s')} achieved"
    mfu, peak = value("compute.mfu"), value("compute.peak_flops")
    if isinstance(mfu, (int, float)) and isinstance(peak, (int, float)):
        out += f"; MFU {mfu:.1%} = FLOPs per step / step time / peak {_si(peak, 'FLOP/s')}"
    return out


def modules_line(compute: ComputeDoc | None) -> str | None:
    """The modules with the most FLOPs and, where the trace timed their forward, the lowest achieved
    rate, in one line; None where the run listed none."""
    rows = compute.modules if compute is not None else []
    if not rows:
        return None
    out = "most FLOPs: " + ", ".join(f"{r.module} {r.share:.0%}" for r in rows[:3])
    rated = [(rate, r) for r in rows if (rate := r.achieved_flops)]
    if rated:
        rate, low = min(rated, key=lambda x: x[0])
        out += (f"; lowest rate: {low.module} {_si(rate, 'FLOP/s')} "
                f"(forward: {_si(low.forward_flops, 'FLOP')} in {low.forward_ms:.3g} ms)")
    return out
