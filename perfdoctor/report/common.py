"""What the renderers share: how a duration, a share and a chart's top are written, one definition
each, so that the text, HTML and Markdown reports agree."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from perfdoctor.contracts.baseline import GateFinding
from perfdoctor.contracts.report import RunInfoDoc
from perfdoctor.gate.compare import Comparison


def target_of(run: RunInfoDoc) -> str:
    """What a report is of, in its heading: the script, the module or the trace."""
    return run.script or run.module or run.trace or ""


def ended_early(run: RunInfoDoc) -> tuple[str, int | None] | None:
    """How the script ended where it did not complete (its reason and exit code); None where it
    completed or reached its steps, or nothing says."""
    ex = run.exit
    if not ex or not ex.reason or ex.reason in ("completed", "steps-reached"):
        return None
    return ex.reason, None if ex.code is UNSET else ex.code


def gate_value(v: Any, unit: str) -> str:
    """A gate row's baseline or current value in the text and HTML reports: MiB for bytes, else 4
    significant digits and the unit."""
    if not isinstance(v, (int, float)):
        return "n/a"
    if unit == "bytes":
        return f"{v / 2**20:.1f} MiB"
    return f"{v:.4g} {unit}".strip()


def new_not_failing(c: Comparison) -> list[GateFinding]:
    """The comparison's new findings that do not fail the gate (those that do are listed apart)."""
    return [f for f in c.new_findings if f not in c.failing_findings]


def pct(v: Any) -> str:
    """A share (0..1) as a whole percentage."""
    return f"{v:.0%}" if isinstance(v, (int, float)) else "n/a"


def chart_top(ms: list[float]) -> float:
    """The top of a step-time axis (sparkline or chart): the slowest step, unless a few steps (the
    first, with its allocator warm-up and lazy imports) are far slower than the rest: then three
    times the 90th percentile, and the steps above it are drawn as off the scale."""
    s = sorted(ms)
    if not s:
        return 0.0
    p90 = s[min(len(s) - 1, int(0.9 * (len(s) - 1) + 0.5))]
    return min(s[-1], 3 * p90) if p90 > 0 else s[-1]
