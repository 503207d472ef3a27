"""Markdown: a readable summary for a pull request comment or $GITHUB_STEP_SUMMARY.

Pure: takes a Report, a gate Comparison, or both, and returns text.
Every string that came from input goes through `perfdoctor.report.escape` where it enters the
document: `md` in prose, `cell` in a table, `_code` in a code span, `_fence` in a code block,
`escape.markdown_html` inside the `<details>` summary.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from perfdoctor.contracts.report import RankRowDoc, StepTimeDoc
from perfdoctor.gate.compare import LEVEL, Comparison, undecided_sentence
from perfdoctor.model import NOTHING_MEASURED, RANK_COLUMNS, Finding, Report, rank_header
from perfdoctor.report import escape
from perfdoctor.report.explain import explanation_lines
from perfdoctor.report.memory import compute_line, memory_line, modules_line

VERDICT_MARK = {"regression": "❌ regression", "improvement": "✅ improvement", "no-change": "no change",
                "inconclusive": "❔ inconclusive", "unstable": "〰️ unstable", "not-comparable": "⚠️ not comparable"}


def md(text: Any, multiline: bool = False) -> str:
    """Input text in prose: single-line unless `multiline`."""
    return escape.markdown(text, multiline)


def cell(text: Any) -> str:
    """Input text in one table cell: no line breaks, pipes escaped."""
    return escape.markdown(text, table=True)


def _code(text: Any, table: bool = False) -> str:
    """Input text as an inline code span."""
    return escape.markdown_code(text, table)


def _ms(v: Any) -> str:
    return "–" if v is None else f"{v:,.2f} ms"


def _where(f: Finding) -> str:
    """`file name:line` of a finding's first location, unescaped; "" without one."""
    locs = f.locations
    if not locs:
        return ""
    loc = locs[0]
    more = f" and {len(locs) - 1} more" if len(locs) > 1 else ""  # the same finding at several lines
    return f"{Path(str(loc.file)).name}:{loc.line}{more}"


def _saving(f: Finding) -> tuple[float, float | None] | None:
    """The finding's saving (ms per step, share of the step) as report.json holds it, None unmeasured."""
    if f.ms_per_step is None:
        return None
    return round(f.ms_per_step, 3), None if f.fraction_of_step is None else round(f.fraction_of_step, 4)


def _loc(f: Finding, table: bool = False) -> str:
    where = _where(f)
    return _code(where, table) if where else ""


def _fence(text: str, lang: str = "") -> str:
    return escape.markdown_fence(text, lang)


def _diff(before: str, after: str) -> str:
    lines = [f"- {l}" for l in before.splitlines()] + [f"+ {l}" for l in after.splitlines()]
    return _fence("\n".join(lines), "diff")


def render_report(report: Report) -> str:
    run, summary = report.run, report.summary
    st = summary.step_time_ms or StepTimeDoc()
    script = Path(str(run.script or "")).name or "trace"
    out = [f"## perfdoctor: {md(script)}" + (f" ({md(run.label)})" if run.label else ""), ""]
    facts = [f"**Step time** {_ms(st.median)} median"]
    if st.p90 is not None:
        facts.append(f"p90 {_ms(st.p90)}")
    if st.n is not None:
        facts.append(f"{st.n} steps")
    for value, label in ((run.device, "device"), (run.torch, "torch")):
        if value:
            facts.append(f"{label} {md(value)}")
    out += [" · ".join(facts), ""]
    if summary.memory and summary.memory.bytes:
        out += [f"**Memory** {md(memory_line(summary.memory))}", ""]
    compute = compute_line(lambda n: report.facts[n].value if n in report.facts else None, summary.compute or None)
    if compute:
        out += [f"**Compute** {md(compute)}", ""]
    mods = modules_line(summary.compute or None)
    if mods:
        out += [f"**Modules** {md(mods)}", ""]
    if summary.contention and summary.contention.inflated:
        out += [f"> ⚠️ **{md(summary.contention.sentence or '')}**", ""]
    if summary.breakdown:
        out += ["| Phase | ms/step | Share |", "|---|---:|---:|"]
        for b in summary.breakdown:
            frac = b.fraction
            out.append(f"| {cell(b.category)} | {b.ms or 0:,.2f} | {'' if frac is None else f'{frac:.0%}'} |")
        out.append("")
    out += _ranks(report.ranks)
    findings = [f for f in report.findings if not f.minor]
    small = [f for f in report.findings if f.minor]
    if not findings and not small:
        out += [NOTHING_MEASURED if report.measured_nothing else "No findings. ✅", ""]
    elif findings:
        out += [f"### Findings ({len(findings)})", "",
                "| # | Rule | Severity | Saves | Location | Finding |", "|---:|---|---|---:|---|---|"]
        for i, f in enumerate(findings, 1):
            saving = _saving(f)
            cost = "–" if saving is None else f"{saving[0]:,.1f} ms/step" + (
                f" ({saving[1]:.0%})" if saving[1] is not None else "")
            out.append(f"| {i} | {cell(f.rule)} {cell(f.name)} | {cell(f.severity)} | {cost} "
                       f"| {_loc(f, table=True)} | {cell(f.title)} |")
        out.append("")
        for f in findings:
            where = f"`{_where(f)}`" if _where(f) else "no location"
            out += [f"<details><summary><b>{escape.markdown_html(f.rule)}</b> {escape.markdown_html(f.title)} "
                    f"({escape.markdown_html(where)})</summary>", ""]
            if f.message:
                out += [md(f.message, multiline=True), ""]
            if f.ms_per_step is None and f.saving_basis:
                out += [f"*{md(f.saving_basis)}*", ""]
            if f.verification is not None:
                v = f.verification
                out += [f"**Verified on this machine:** {md(v.verdict)} ({md(v.kind)}, {v.runs} runs): {md(v.why)}", ""]
            if f.why:
                out += [f"**Why:** {md(f.why, multiline=True)}", ""]
            for loc in f.locations[:10]:
                if loc.code:
                    out += [_code(f"{loc.file}:{loc.line}"), "", _fence(escape.clean(loc.code), "python"), ""]
            fix = f.fix
            if fix:
                out += ["**Fix, for example:**" if fix.example else "**Fix:**", ""]
                if fix.before or fix.after:
                    out += [_diff(fix.before or "", fix.after or ""), ""]
                if fix.note:
                    out += [md(fix.note, multiline=True), ""]
            refs = f.references
            if refs:
                out += ["References: " + ", ".join(md(r) for r in refs), ""]
            out += ["</details>", ""]
    if small:  # measured, and worth under 1 % of the step or 0.2 ms: one line each
        out += [f"**Minor ({len(small)})**: measured, under 1% of the step or 0.2 ms each", ""]
        for f in small:
            saving = _saving(f)
            out.append(f"- {md(f.rule)} {md(f.name)}: {saving[0] if saving is not None else 0:,.3f} ms/step "
                       f"{_loc(f)} {md(f.title)}")
        out.append("")
    for n in report.notes:
        out.append(f"> {md(n)}")
    return "\n".join(out).rstrip() + "\n"


def _ranks(rows: Sequence[RankRowDoc]) -> list[str]:
    """The rank table of a distributed job: the columns some rank has a value for."""
    cols = [c for c in RANK_COLUMNS if any(row.value(c[0]) is not None for row in rows)]
    if not rows or not cols:
        return []
    out = ["| Rank | " + " | ".join(rank_header(label, kind) for _, label, kind in cols) + " |",
           "|---:|" + "".join("---:|" if kind != "str" else "---|" for _, _, kind in cols)]
    for row in rows:
        cells = []
        for key, _, kind in cols:
            v = row.value(key)
            if v is None or not isinstance(v, (int, float)):
                cells.append(cell("" if v is None else v))
            else:
                cells.append(f"{v:.0%}" if kind == "share" else f"{v:,.0f}" if kind == "MHz" else f"{v:,.1f}")
        out.append(f"| {cell(row.rank)} | " + " | ".join(cells) + " |")
    return out + [""]


def _num(v: Any, unit: str) -> str:
    if v is None:
        return "–"
    if unit == "bytes":
        return f"{v / 2**20:,.1f} MiB"
    if unit == "ms":
        return f"{v:,.2f} ms"
    return f"{v:,.2f} {unit}"


def render_comparison(c: Comparison) -> str:
    head = {"failed": "❌ perfdoctor gate: failed", "passed": "✅ perfdoctor gate: passed",
            "undecided": "❔ perfdoctor gate: undecided (not passed)",
            "host-contention": "❔ perfdoctor gate: host contention, not decided (not passed)",
            "not-comparable": "⚠️ perfdoctor gate: baseline not comparable"}[c.verdict]
    out = [f"## {head}", "",
           f"Threshold {c.max_regression:.0%} · baseline {c.baseline_runs} run(s) · current {c.current_runs} run(s)"
           + (f" · fail on new findings at or above {c.fail_on}" if c.fail_on else "")
           + (" · strict" if c.strict else ""), ""]
    if c.verdict == "undecided":
        out += [f"> **{undecided_sentence(c)}**", ""]
    for n in c.notes:
        if n.startswith(("NOT COMPARABLE", "host contention: not decided")):
            out += [f"> **{md(n)}**", ""]
    out += [f"| Metric | Baseline | Current | Change | {LEVEL:.0%} CI | Verdict |", "|---|---:|---:|---:|---:|---|"]
    for r in c.rows:
        change = "–" if r.change_pct is None else f"{r.change_pct:+.1f}%"
        ci = "–" if not r.ci_pct else f"{r.ci_pct[0]:+.1f}% … {r.ci_pct[1]:+.1f}%"
        out.append(f"| {cell(r.metric)} | {_num(r.baseline, r.unit)} | {_num(r.current, r.unit)} "
                   f"| {change} | {ci} | {VERDICT_MARK.get(r.verdict, r.verdict)}"
                   + (" (point estimate)" if r.basis == "point-estimate" and r.verdict == "regression" else "") + " |")
    out.append("")
    failing = {f.fingerprint for f in c.failing_findings}
    if c.new_findings:
        out += ["### New findings", ""]
        for f in c.new_findings:
            mark = "❌ " if f.fingerprint in failing else ""
            where = f" at {_code(Path(str(f.file)).name + ':' + str(f.line))}" if f.file else ""
            out.append(f"- {mark}**{md(f.rule)}** ({md(f.severity)}) {md(f.title)}{where}")
        out.append("")
    if c.resolved_findings:
        out += ["### Resolved findings", ""] + [f"- ✅ **{md(f.rule)}** {md(f.title)}" for f in c.resolved_findings] + [""]
    why = explanation_lines(c.explanation)
    if why:
        out += ["### Why it changed", ""] + [f"- {md(line)}" for line in why] + [""]
    rest = [n for n in c.notes if not n.startswith(("NOT COMPARABLE", "host contention: not decided"))]
    if rest:
        out += [f"> {md(n)}" for n in rest] + [""]
    return "\n".join(out).rstrip() + "\n"


def render_both(report: Report, comparison: Comparison) -> str:
    """The report, then the gate's verdict."""
    return render_report(report) + "\n" + render_comparison(comparison)


def append_step_summary(markdown: str, environ: Mapping[str, str] | None = None) -> bool:
    """Append to the file named by $GITHUB_STEP_SUMMARY when it is set; True when written."""
    path = (environ if environ is not None else os.environ).get("GITHUB_STEP_SUMMARY")
    if not path:
        return False
    with open(path, "a", encoding="utf-8") as f:
        f.write(markdown if markdown.endswith("\n") else markdown + "\n")
    return True
