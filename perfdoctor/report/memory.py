"""The summary's memory (facts/run/memory.py `_summary`) in one line, the same in the text, Markdown and
HTML reports. No rich here: the machine formats import it."""

from __future__ import annotations

from typing import Any


def _mib(b: float) -> str:
    return f"{b / 2**20:,.1f} MiB"


def memory_line(mem: dict[str, Any]) -> str:
    """The summary's memory in one line: its source, first and last value, the growth per step with
    its interval, the peak's parts where known. Shared by the text, Markdown and HTML reports."""
    series = [v for v in mem.get("bytes") or [] if v is not None]
    out = f"{mem.get('source', 'memory')} {_mib(series[0])} -> {_mib(series[-1])}" if series else ""
    g, ci = mem.get("growth_bytes_per_step"), mem.get("growth_interval")
    if g is not None and ci:
        out += f", {'+' if g >= 0 else ''}{_mib(g)}/step over the steady steps (90% interval {_mib(ci[0])}..{_mib(ci[1])})"
    parts = mem.get("parts") or {}
    if parts:
        out += "; peak: " + ", ".join(f"{k.replace('_', ' ')} {_mib(v)}" for k, v in parts.items())
        if mem.get("peak_bytes"):
            out += f" of {_mib(mem['peak_bytes'])}"
    return out
