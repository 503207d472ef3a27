"""GitHub Actions workflow commands: annotations on the user's lines and a failed-gate error.

Pure: takes a Report, a Comparison, or both and returns the command lines.
Every message and property value goes through `perfdoctor.report.escape` (`github_data`,
`github_property`): control characters dropped, then the runner's rules: in the message, % CR LF
become %25 %0D %0A; in a property value, also : and , become %3A and %2C.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from perfdoctor.gate.compare import LEVEL, Comparison, host_contention_sentence, undecided_sentence
from perfdoctor.model import Location, Report
from perfdoctor.report.escape import github_data, github_property

COMMAND = {"high": "error", "medium": "warning", "low": "notice"}
MAX_ANNOTATIONS = 10  # GitHub shows at most 10 errors and 10 warnings per step


def command(kind: str, message: str, **props: Any) -> str:
    parts = ",".join(f"{k}={github_property(v)}" for k, v in props.items() if v not in (None, ""))
    return f"::{kind}{' ' + parts if parts else ''}::{github_data(message)}"


def _rel(file: str, root: Path | None) -> str:
    p = Path(file)
    if root is not None and p.is_absolute():
        try:
            return p.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    return p.as_posix()


def _root(root: Path | str | None) -> Path:
    return Path(root) if root is not None else Path(os.environ.get("GITHUB_WORKSPACE") or os.getcwd())


def render_report(report: Report, root: Path | str | None = None, limit: int = MAX_ANNOTATIONS) -> str:
    base = _root(root)
    lines: list[str] = []
    contention = report.summary.contention
    if contention and contention.inflated:
        lines.append(command("warning", contention.sentence or "", title="perfdoctor: step times inflated"))
    for f in report.findings[:limit]:
        msg = f.message or f.title or ""
        if f.ms_per_step is not None:
            msg += f" (saves ~{round(f.ms_per_step, 3):.1f} ms/step)"  # as report.json holds it
        if f.verification is not None:
            v = f.verification
            msg += f"\nverify: {v.verdict} ({v.kind}): {v.why}"
        if f.fix and f.fix.after:
            msg += f"\nFix: {f.fix.after}"
        # one annotation at each line the finding was found at; its other lines after the other findings' first
        where: list[Location | None] = list(f.locations) or [None]
        for loc in where[:1 if len(lines) >= limit // 2 else 10]:
            lines.append(command(COMMAND.get(f.severity, "warning"), msg,
                                 file=_rel(loc.file, base) if loc is not None and loc.file else None,
                                 line=(loc.line or None) if loc is not None else None,
                                 title=f"{f.rule} {f.title}".strip()))
    return "\n".join(lines) + ("\n" if lines else "")


def render_comparison(c: Comparison, root: Path | str | None = None, limit: int = MAX_ANNOTATIONS) -> str:
    base = _root(root)
    lines = []
    if not c.comparable:
        diffs = "; ".join(f"{d['key']} {d['baseline']} -> {d['current']}" for d in c.env_differences)
        lines.append(command("warning", f"The baseline is not comparable with this run ({diffs}); timings were not judged. "
                                        "Record a new baseline in this environment.", title="perfdoctor gate: not comparable"))
    for r in c.rows:
        if r.verdict == "regression":
            ci = f" ({LEVEL:.0%} CI {r.ci_pct[0]:+.1f}%..{r.ci_pct[1]:+.1f}%)" if r.ci_pct else ""
            how = " by its point estimate, beyond twice the threshold" if r.basis == "point-estimate" else ""
            lines.append(command("error", f"{r.metric} regressed {r.change_pct:+.1f}%{how}{ci}: "
                                          f"{r.baseline:.4g} -> {r.current:.4g} {r.unit}",
                                 title=f"perfdoctor gate: {r.metric} regression"))
        elif r.verdict in ("unstable", "inconclusive"):
            lines.append(command("warning", f"{r.metric}: {r.verdict} ({r.change_pct:+.1f}%)" if r.change_pct is not None
                                 else f"{r.metric}: {r.verdict}", title="perfdoctor gate"))
    for f in c.failing_findings[:limit]:
        lines.append(command("error", f"New {f.severity} finding: {f.title}",
                             file=_rel(f.file, base) if f.file else None, line=f.line or None,
                             title=f"{f.rule} (new since baseline)"))
    if c.failed:
        why = [f"{r.metric} {r.change_pct:+.1f}%" + (" (point estimate; its interval was undecided)"
                                                           if r.basis == "point-estimate" and r.kind == "timing" else "")
               for r in c.rows if r.verdict == "regression"]
        if c.strict and c.undecided and not why:
            why.append("the step time is undecided (--strict)")
        if c.strict and c.host_contention and not why:
            why.append("the host's contention left the step time undecided (--strict)")
        n = len(c.failing_findings)
        if n:
            why.append(f"{n} new finding(s) at or above {c.fail_on}")
        lines.append(command("error", "perfdoctor gate failed: " + "; ".join(why)))
    elif c.verdict == "undecided":
        lines.append(command("warning", undecided_sentence(c), title="perfdoctor gate: undecided (not passed)"))
    elif c.verdict == "host-contention":
        lines.append(command("warning", host_contention_sentence(c), title="perfdoctor gate: host contention (not passed)"))
    return "\n".join(lines) + ("\n" if lines else "")


def render_both(report: Report, comparison: Comparison, root: Path | str | None = None, limit: int = MAX_ANNOTATIONS) -> str:
    """The report's annotations, then the gate's."""
    return render_report(report, root, limit) + render_comparison(comparison, root, limit)
