"""The human report: one screen, most costly problem first. Renders only; never measures.

Renders to rich renderables; the CLI prints them on the terminal, or as plain text into a file.
Every string that came from input enters as a `Text` (never parsed as rich markup) through `_t` or
`_cell` (`perfdoctor.report.escape.text`), and the whole document is wrapped in `CommandSafe`, which
guards the lines that rich's wrapping happens to start with `::` (a workflow command in a CI log)."""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console, ConsoleOptions, Group, JustifyMethod, RenderableType, RenderResult
from rich.highlighter import ReprHighlighter
from rich.padding import Padding
from rich.panel import Panel
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from perfdoctor.contracts.report import BreakdownDoc
from perfdoctor.gate.compare import LEVEL, Comparison
from perfdoctor.model import NO_FINDINGS, NOTHING_MEASURED, RANK_COLUMNS, Finding, Report, rank_header
from perfdoctor.report import escape
from perfdoctor.report.common import chart_top, ended_early, gate_value, new_not_failing, target_of
from perfdoctor.report.explain import explanation_lines
from perfdoctor.report.memory import compute_line, memory_line, modules_line
from perfdoctor.stats import ms_text

SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}
BAR_COLORS = ["magenta", "blue", "green", "yellow", "cyan", "red", "bright_black", "white", "bright_magenta"]
BAR_WIDTH = 50
_HIGHLIGHT = ReprHighlighter()  # what rich does to a plain string in a table cell


def _t(value: Any, style: str = "", multiline: bool = False) -> Text:
    """Input text as rich Text: control characters and line breaks (unless `multiline`) dropped,
    never read as markup."""
    return Text(escape.text(value, multiline), style=style)


def _cell(value: Any, multiline: bool = False) -> Text:
    """Input text in a table cell, highlighted as rich highlights a plain string there."""
    return _HIGHLIGHT(_t(value, multiline=multiline))


class CommandSafe:
    """Renders `renderable` as it would print, then guards every line that a CI runner would read
    as a workflow command (`::` after leading whitespace: rich's word wrap can start a line with any
    word of the input) with a backslash in front of the `::`, taking a trailing space to keep the width."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in console.render_lines(self.renderable, options, pad=False, new_lines=True):
            yield from _guard(line)


def _guard(line: list[Segment]) -> list[Segment]:
    plain = "".join(seg.text for seg in line if not seg.control)
    if not escape.command_line_start(plain):
        return line
    at = len(plain) - len(plain.lstrip())  # where the `::` starts
    out: list[Segment] = []
    for seg in line:
        if not seg.control and 0 <= at < len(seg.text):
            seg = Segment(seg.text[:at] + "\\" + seg.text[at:], seg.style)
        if not seg.control:
            at -= len(seg.text)
        out.append(seg)
    for i in range(len(out) - 1, -1, -1):  # keep the width: one trailing space less, where there is one
        seg = out[i]
        body = seg.text.rstrip("\n")
        if seg.control or not body:
            continue
        if body.endswith(" "):
            out[i] = Segment(body[:-1] + seg.text[len(body):], seg.style)
        break
    return out


def _short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
        return rel if not rel.startswith("..") else path
    except ValueError:
        return path


SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60


def sparkline(ms: list[float], width: int = SPARK_WIDTH, lo: float = 0.0) -> str:
    """Step times as unicode blocks from `lo` (0: a time's scale starts at nothing; memory's at its
    least) to `chart_top`, one block per step or, for a long run, the largest of each run of steps
    (a stall stays visible)."""
    top = chart_top(ms)
    if not ms or top <= lo:
        return ""
    per = max(1, -(-len(ms) // width))
    cols = [max(ms[i:i + per]) for i in range(0, len(ms), per)]
    return "".join(SPARK[max(0, min(len(SPARK) - 1, int((min(v, top) - lo) / (top - lo) * len(SPARK))))] for v in cols)


def breakdown_bar(breakdown: list[BreakdownDoc]) -> Text:
    text = Text()
    breakdown = [b for b in breakdown if (b.ms or 0) > 0]  # parts this run never saw
    total = sum(max(0.0, b.ms or 0.0) for b in breakdown)
    if total <= 0:
        return text
    used = 0
    for i, b in enumerate(breakdown):
        share = max(0.0, b.ms or 0.0) / total
        width = round(share * BAR_WIDTH) if i < len(breakdown) - 1 else BAR_WIDTH - used
        width = max(0, min(width, BAR_WIDTH - used))
        used += width
        text.append("█" * width, style=BAR_COLORS[i % len(BAR_COLORS)])
    text.append("\n")
    for i, b in enumerate(breakdown):
        frac = (b.ms or 0.0) / total
        text.append("■ ", style=BAR_COLORS[i % len(BAR_COLORS)])
        text.append(f"{escape.text(b.category)} {ms_text(b.ms)} ({frac:.0%})")
        text.append("   " if i < len(breakdown) - 1 else "")
    return text


def _summary(report: Report) -> Panel:
    run, s = report.run, report.summary
    rows = Table.grid(padding=(0, 2))
    rows.add_column(style="bold")
    rows.add_column()
    rows.add_row("analysed", _t(_short(str(target_of(run))) + (f"  ({run.device})" if run.device else "")))
    if run.label:
        rows.add_row("ranks", _t(str(run.label)))
    steps = s.steps_observed
    if steps is not None:
        clock = run.step_clock or s.step_clock or ""
        rows.add_row("steps", _t(f"{steps} seen, {s.steps_profiled or 0} profiled"
                                 + (f"  (counted by {clock})" if clock else "")))
    st = s.step_time_ms
    if st is not None and st.median is not None:
        rows.add_row("step time", f"median {ms_text(st.median)}, p90 {ms_text(st.p90)}"
                     + (f" over {st.n} steps" if st.n else ""))
    series = s.step_series.ms if s.step_series else []
    if len(series) >= 2:
        top = chart_top(series)
        rows.add_row("each step", Text(sparkline(series), style="blue")
                     + Text(f"  steps 1-{len(series)}, █ = {ms_text(top)}" + (" or more" if top < max(series) else ""),
                            style="dim"))
    mem = s.memory
    mem_series = [float(v) for v in mem.bytes if v is not None] if mem else []
    if mem and len(mem_series) >= 2:
        rows.add_row("memory", Text(sparkline(mem_series, lo=min(mem_series)), style="magenta")
                     + Text("  " + memory_line(mem), style="dim"))
    compute = compute_line(lambda n: report.facts[n].value if n in report.facts else None, s.compute or None)
    if compute:
        rows.add_row("compute", Text(compute, style="dim"))
    mods = modules_line(s.compute or None)
    if mods:
        rows.add_row("modules", Text(mods, style="dim"))
    if s.contention and s.contention.inflated:
        rows.add_row("contention", _t(str(s.contention.sentence or ""), style="bold yellow"))
    ended = ended_early(run)
    if ended:
        rows.add_row("script", _t(f"{ended[0]} (exit code {ended[1]})", style="bold red"))
    parts: list[Any] = [rows]
    for bars, label in ((s.breakdown, "where a step goes"), (s.gpu_breakdown, "GPU timeline per step")):
        if bars:
            parts += [Text(""), Text(label, style="bold"), breakdown_bar(bars)]
    return Panel(Group(*parts), title="perfdoctor", title_align="left", border_style="blue")


def _cost(f: Finding) -> Text:
    if f.ms_per_step is None:
        return Text("cost not measured here", style="dim")
    t = Text(f"saves ~{ms_text(f.ms_per_step)}/step", style="bold green")
    if f.saving_range is not None and ms_text(f.saving_range[0]) != ms_text(f.saving_range[1]):
        lo, hi = f.saving_range  # a range that prints as one number says nothing more
        t.append(f" ({ms_text(lo)}–{ms_text(hi)} across steps)", style="green")
    if f.fraction_of_step is not None:
        t.append(f" ({f.fraction_of_step:.0%} of the step)", style="green")
    return t


MAX_LOCATIONS = 10  # a finding's locations shown; report.json keeps every one


def _indent(r: Any) -> Padding:
    return Padding(r, (0, 0, 0, 3))


def _finding(i: int, f: Finding) -> Group:
    head = Text(f"{i}. ", style="bold")
    head.append(escape.text(f"{f.rule} {f.name}"), style="bold")
    head.append("  ")
    head.append(escape.text(f.severity.upper()), style=SEVERITY_STYLE.get(f.severity, ""))
    head.append("  ")
    head.append_text(_cost(f))
    parts: list[Any] = [head, _indent(_t(f.title, style="bold"))]
    if f.verification is not None:
        good = f.verification.verdict in ("verified", "larger")
        parts.append(_indent(_t(f.verification.sentence(), style="green" if good else "yellow")))
    for loc in f.locations[:MAX_LOCATIONS]:  # a finding found at several lines (the same words) lists them all
        where = _t(f"{_short(loc.file)}:{loc.line}", style="cyan")
        if loc.code:
            where.append(f"   {escape.text(loc.code)}", style="dim")
        parts.append(_indent(where))
    if len(f.locations) > MAX_LOCATIONS:
        parts.append(_indent(Text(f"and {len(f.locations) - MAX_LOCATIONS} more locations (report.json lists them)",
                                  style="dim")))
    parts.append(_indent(_t(f.message, multiline=True)))
    if f.ms_per_step is None and f.saving_basis:
        parts.append(_indent(_t(f"({f.saving_basis})", style="dim")))
    if f.fix and (f.fix.before or f.fix.after or f.fix.note):
        diff = Text("fix, for example:\n" if f.fix.example else "fix:\n", style="bold")
        before = escape.text(f.fix.before, multiline=True).splitlines()
        after = escape.text(f.fix.after, multiline=True).splitlines()
        indent = min((len(l) - len(l.lstrip()) for l in before + after if l.strip()), default=0)
        for line in before:
            diff.append(f"- {line[indent:]}\n", style="red")
        for line in after or ([""] if before else []):
            diff.append(f"+ {line[indent:]}\n", style="green")
        if f.fix.note:
            diff.append(escape.text(f.fix.note, multiline=True), style="dim")
        parts.append(_indent(diff))
    parts.append(_indent(_t(f"confidence {f.confidence} · `perfdoctor explain {f.rule}` for why and references\n",
                            style="dim", multiline=True)))
    return Group(*parts)


def render_report(report: Report) -> RenderableType:
    return CommandSafe(_report(report))


def _report(report: Report) -> Group:
    parts: list[RenderableType] = [_summary(report)]
    if report.ranks:
        t = Table(title="ranks", title_justify="left")
        kinds = {"rank": "str"} | {k: kind for k, _, kind in RANK_COLUMNS}
        headers = {"rank": "rank"} | {k: rank_header(label, kind) for k, label, kind in RANK_COLUMNS}
        keys = [k for k in kinds if any(r.value(k) is not None for r in report.ranks)]
        for k in keys:  # headings of words, which wrap in a narrow terminal (fact keys were cut to "step_…")
            t.add_column(headers[k], justify="right")
        for r in report.ranks:
            t.add_row(*[(f"{v:.0%}" if kinds[k] == "share" else f"{v:.0f}" if kinds[k] == "MHz" else f"{v:.1f}")
                        if isinstance(v := r.value(k), float) else _cell(r.value(k, unset="")) for k in keys])
        parts.append(t)
    if report.findings:
        major = [f for f in report.findings if not f.minor]
        small = [f for f in report.findings if f.minor]
        if major:
            parts.append(Text(f"{len(major)} finding(s), most costly first", style="bold"))
        for i, f in enumerate(major, 1):
            parts.append(_finding(i, f))
        if small:  # measured, and worth under 1 % of the step or 0.2 ms: one line each
            parts.append(Text(f"minor ({len(small)}): measured, under 1% of the step or 0.2 ms each", style="bold"))
            for f in small:
                line = Text(f"{f.rule} {f.name}  ", style="dim")
                line.append_text(_cost(f))
                loc = f.locations[0] if f.locations else None
                if loc:
                    line.append_text(_t(f"  {_short(loc.file)}:{loc.line}", style="cyan"))
                    if len(f.locations) > 1:
                        line.append_text(Text(f" and {len(f.locations) - 1} more", style="cyan"))
                line.append_text(_t(f"  {f.title}"))
                parts.append(_indent(line))
    else:
        parts.append(Text(NOTHING_MEASURED, style="bold yellow") if report.measured_nothing
                     else Text(NO_FINDINGS, style="bold green"))
    if report.hotspots:
        t = Table(title="hot spots in your code (profiled steps)", title_justify="left", show_edge=False)
        t.add_column("function")
        t.add_column("where", overflow="fold")
        t.add_column("ms/step", justify="right")
        t.add_column("hot lines (self time)")  # the share of the function's own time: a called function's is its own
        main = [h for h in report.hotspots if h.process == "main"]
        workers = [h for h in report.hotspots if h.process != "main"]
        for h in main[:8] + workers[:4]:
            lines = "\n".join(f"{escape.clean(l.line)}: {escape.clean(l.code)[:48]} ({l.share:.0%})"
                              for l in h.lines[:3])  # one line each: the line breaks are these
            name = f"{h.function} [DataLoader workers]" if h.process == "dataloader-workers" else h.function
            t.add_row(_cell(name), _cell(f"{_short(h.file)}:{h.line}"), f"{h.ms_per_step:.2f}", _cell(lines, multiline=True))
        parts.append(t)
    for n in report.notes:
        parts.append(_t(f"note: {n}", style="dim"))
    run_dir = report.run.run_dir
    if run_dir:
        hint = " (trace.json.gz opens in https://ui.perfetto.dev)" if report.run.trace_file else ""
        parts.append(_t(f"run folder: {_short(str(run_dir))}{hint}", style="dim"))
    return Group(*parts)


VERDICT_STYLE = {"regression": "bold red", "host-contention": "yellow", "improvement": "green", "no-change": "", "inconclusive": "yellow",
                 "unstable": "yellow", "not-comparable": "magenta"}


def render_comparison(comparison: Comparison) -> RenderableType:
    """The CI gate's verdict: one row per metric, new findings, and why it failed or passed."""
    return CommandSafe(_comparison(comparison))


def _comparison(c: Comparison) -> Group:
    verdict = c.verdict
    style = {"failed": "bold red", "passed": "bold green"}.get(verdict, "bold magenta")
    t = Table(title=f"gate: {verdict.upper()} (threshold {100 * c.max_regression:.0f}%, "
                    f"{c.baseline_runs} baseline run(s) vs {c.current_runs})",
              title_justify="left", title_style=style, show_edge=False)
    # the change is the estimate; beside it, the interval its verdict reads (a bootstrap's percentiles
    # of a low quantile, which need not hold the estimate): each labelled as what it is. Cells wrap
    # (fold), never cut, in an 80-column terminal.
    level = f"{LEVEL:.0%}"
    columns: list[tuple[str, JustifyMethod]] = [
        ("metric", "left"), ("baseline", "right"), ("current", "right"), ("change (estimate)", "right"),
        (f"{level} interval of the change", "right"), ("verdict", "left")]
    for col, just in columns:
        t.add_column(col, justify=just, overflow="fold")
    outside = []
    for r in c.rows:
        ci, change = r.ci_pct, r.change_pct
        t.add_row(_cell(r.metric), gate_value(r.baseline, r.unit), gate_value(r.current, r.unit),
                  "" if change is None else f"{change:+.1f}%",
                  "" if not ci else f"{ci[0]:+.1f}% to {ci[1]:+.1f}%",
                  Text(r.verdict, style=VERDICT_STYLE.get(r.verdict, "")))
        if ci and change is not None and not ci[0] <= change <= ci[1]:
            outside.append(r.metric)
    parts: list[RenderableType] = [t]
    if outside:
        parts.append(_t(f"note: {', '.join(dict.fromkeys(outside))}: the estimate (the runs' step-time quantile, "
                        f"current over baseline) lies outside its {level} interval (the bootstrap of that ratio over "
                        f"the steps and the run-to-run noise, which is skewed when the runs scatter); the verdict reads "
                        f"the interval", style="dim"))
    for f in c.failing_findings:
        parts.append(_t(f"new finding fails the gate: {f.rule} {f.title}", style="bold red"))
    for f in new_not_failing(c):
        parts.append(_t(f"new finding: {f.rule} {f.title}", style="yellow"))
    why = explanation_lines(c.explanation)
    if why:
        parts.append(_t("why it changed:", style="bold"))
        parts += [_t(f"  {line}") for line in why]
    for n in c.notes:
        parts.append(_t(f"note: {n}", style="dim"))
    return Group(*parts)


def render_both(report: Report, comparison: Comparison) -> RenderableType:
    """The report, then the gate's verdict."""
    return CommandSafe(Group(_report(report), _comparison(comparison)))
