"""`perfdoctor history` rendered: a script's runs over time as text (a table and a sparkline), JSON,
Markdown, or an HTML page with a trend chart (commits on the axis, change points and one-offs
marked). Renders a `history.view.HistoryView`; measures nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfdoctor.history.view import HistoryView, Shift
from perfdoctor.report import escape

HISTORY_FORMATS = ("text", "json", "markdown", "html")


def render_history(fmt: str, view: HistoryView) -> Any:
    """The history in `fmt` (one of HISTORY_FORMATS): rich renderables for text, else the document."""
    return {"text": _text, "json": _json, "markdown": _markdown, "html": _html}[fmt](view)


def _commit(c: str | None, dirty: bool | None = None) -> str:
    return "" if not c else c[:8] + ("*" if dirty else "")


def _when(started: str | None) -> str:
    return (started or "")[:16].replace("T", " ")


def shift_sentence(s: Shift, runs: int) -> str:
    """One line per change point: where, how much, and what else changed there."""
    word = "slower" if s.ratio > 0 else "faster"
    line = (f"from run {s.index + 1} of {runs} the step is {abs(s.ratio):.0%} {word}: "
            f"{s.before_ms:.2f} ms -> {s.after_ms:.2f} ms")
    if s.env_changes:
        return line + "; the environment changed there (" + "; ".join(s.env_changes) + "): likely the cause"
    a, b = s.commits
    if a and b and a != b:
        return line + f"; first seen at commit {a[:8]} -> {b[:8]}"
    return line


def _text(view: HistoryView) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from perfdoctor.report.text import sparkline

    if view.script is None:
        if not view.scripts:
            return Text(f"no runs recorded in {view.store} yet: `perfdoctor run SCRIPT` keeps each run there")
        t = Table(title=f"scripts in {view.store} (--script NAME shows one)", show_edge=False)
        t.add_column("script")
        t.add_column("runs", justify="right")
        for name, n in view.scripts:
            t.add_row(escape.text(name), str(n))
        return t
    values = [v for v in view.values_ms if v is not None]
    head = Text(f"{escape.text(view.script)}: {len(view.runs)} run(s)"
                + (f" on {escape.text(view.branch)}" if view.branch else "") + f", from {escape.text(view.store)}\n")
    if values:
        head.append(f"step time  {sparkline(values)}  {min(values):.2f}-{max(values):.2f} ms ({view.statistic})\n")
    t = Table(show_edge=False)
    for col in ("#", "started", "commit", "branch", "step ms", "CPU wait ms", "findings", ""):
        t.add_column(col, justify="right" if col in ("#", "step ms", "CPU wait ms", "findings") else "left",
                     no_wrap=col in ("started", "commit"))
    starts = {s.index: s for s in view.shifts}
    for i, (r, v) in enumerate(zip(view.runs, view.values_ms)):
        mark = ""
        if i in starts:
            mark = f"◆ change {starts[i].ratio:+.0%}"
        elif i in view.one_offs:
            mark = "one-off"
        t.add_row(str(i + 1), _when(r.started), _commit(r.git_commit, r.git_dirty), escape.text(r.git_branch or ""),
                  "" if v is None else f"{v:.2f}", "" if r.cpu_wait_ms is None else f"{r.cpu_wait_ms:.1f}",
                  str(len(r.findings)), mark)
    lines = [shift_sentence(s, len(view.runs)) for s in view.shifts]
    if not view.shifts and len(values) >= 6:
        lines.append("no change point: the step time held within its run-to-run noise"
                     + (f" (about {view.sigma:.1%})" if view.sigma else ""))
    if view.one_offs:
        lines.append("one-off runs (far from their neighbours, not a change): "
                     + ", ".join(str(i + 1) for i in view.one_offs))
    return Group(head, t, Text("\n".join(escape.text(x) for x in lines)))


def _json(view: HistoryView) -> str:
    from perfdoctor.report.jsonfmt import dumps

    return dumps(view.as_dict())


def _markdown(view: HistoryView) -> str:
    md = escape.markdown
    if view.script is None:
        rows = ["| script | runs |", "|---|---:|"] + [f"| {md(s, table=True)} | {n} |" for s, n in view.scripts]
        return "\n".join([f"## perfdoctor history: {md(view.store)}", "", *rows, ""]) + "\n"
    out = [f"## perfdoctor history: {md(view.script)}", "", f"Step time per run: {md(view.statistic)}.", ""]
    out += [f"- {md(shift_sentence(s, len(view.runs)))}" for s in view.shifts] or ["No change point in the step time."]
    out += ["", "| # | started | commit | branch | step ms | CPU wait ms | findings | |", "|---:|---|---|---|---:|---:|---:|---|"]
    starts = {s.index: s for s in view.shifts}
    for i, (r, v) in enumerate(zip(view.runs, view.values_ms)):
        mark = f"change {starts[i].ratio:+.0%}" if i in starts else ("one-off" if i in view.one_offs else "")
        out.append(f"| {i + 1} | {md(_when(r.started), table=True)} | {escape.markdown_code(_commit(r.git_commit, r.git_dirty), table=True) if r.git_commit else ''} "
                   f"| {md(r.git_branch or '', table=True)} | {'' if v is None else f'{v:.2f}'} "
                   f"| {'' if r.cpu_wait_ms is None else f'{r.cpu_wait_ms:.1f}'} | {len(r.findings)} | {mark} |")
    return "\n".join(out) + "\n"


def _chart(view: HistoryView) -> str:
    """The trend: one point per run, commits under the axis, change points as dashed lines, one-offs
    hollow."""
    from perfdoctor.report.charts import svg

    e = escape.html_text
    pts = [(i, v) for i, v in enumerate(view.values_ms) if v is not None]
    if not pts:
        return "<p>No run has a step time.</p>"
    W, H, L, B, T = 760, 260, 56, 64, 16
    top = max(v for _, v in pts) * 1.1
    n = max(1, len(view.runs) - 1)

    def x(i: int) -> float:
        return L + (W - L - 16) * (i / n if len(view.runs) > 1 else 0.5)

    def y(v: float) -> float:
        return T + (H - T - B) * (1 - v / top)

    out = [f'<line x1="{L}" x2="{W - 8}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#888"/>',
           f'<text x="{L - 6}" y="{y(top / 1.1):.1f}" text-anchor="end" font-size="11">{top / 1.1:.1f} ms</text>',
           f'<text x="{L - 6}" y="{y(0):.1f}" text-anchor="end" font-size="11">0</text>']
    out.append('<polyline fill="none" stroke="#4477aa" stroke-width="1.5" points="'
               + " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in pts) + '"/>')
    for i, v in pts:
        hollow = i in view.one_offs
        out.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="3.5" fill="{"#fff" if hollow else "#4477aa"}" '
                   f'stroke="#4477aa"><title>run {i + 1}: {v:.2f} ms{" (one-off)" if hollow else ""}</title></circle>')
    for s in view.shifts:
        cx = (x(s.index - 1) + x(s.index)) / 2 if s.index else x(s.index)
        out.append(f'<line class="change" x1="{cx:.1f}" x2="{cx:.1f}" y1="{T}" y2="{y(0):.1f}" stroke="#cc3311" '
                   f'stroke-dasharray="4 3"><title>{e(shift_sentence(s, len(view.runs)))}</title></line>')
    every = max(1, len(view.runs) // 12)
    for i, r in enumerate(view.runs):
        if i % every == 0 or i in {s.index for s in view.shifts}:
            out.append(f'<text x="{x(i):.1f}" y="{H - B + 14}" font-size="10" text-anchor="end" '
                       f'transform="rotate(-45 {x(i):.1f} {H - B + 14})">{e(_commit(r.git_commit, r.git_dirty) or i + 1)}</text>')
    return svg(W, H, f"step time of {view.script} per run, change points marked", "".join(out))


def _html(view: HistoryView) -> str:
    from perfdoctor.report.html import _page

    e = escape.html_text
    if view.script is None:
        rows = "".join(f"<tr><td>{e(s)}</td><td>{n}</td></tr>" for s, n in view.scripts)
        return _page("perfdoctor history", [f"<h1>perfdoctor history</h1><p>{e(view.store)}</p>"
                                            f"<table><tr><th>script</th><th>runs</th></tr>{rows}</table>"])
    shifts = "".join(f"<li>{e(shift_sentence(s, len(view.runs)))}</li>" for s in view.shifts) \
        or "<li>No change point in the step time.</li>"
    rows = "".join(
        f"<tr><td>{i + 1}</td><td>{e(_when(r.started))}</td><td><code>{e(_commit(r.git_commit, r.git_dirty))}</code></td>"
        f"<td>{e(r.git_branch or '')}</td><td>{'' if v is None else f'{v:.2f}'}</td>"
        f"<td>{'' if r.cpu_wait_ms is None else f'{r.cpu_wait_ms:.1f}'}</td><td>{len(r.findings)}</td></tr>"
        for i, (r, v) in enumerate(zip(view.runs, view.values_ms)))
    body = [f"<h1>perfdoctor history: {e(Path(str(view.script)).name)}</h1>",
            f'<section id="trend"><h2>Step time per run</h2><p class="dim">{e(view.statistic)}</p>{_chart(view)}<ul class="shifts">{shifts}</ul></section>',
            '<section id="runs"><h2>Runs</h2><table><tr><th>#</th><th>started</th><th>commit</th><th>branch</th>'
            f"<th>step ms</th><th>CPU wait ms</th><th>findings</th></tr>{rows}</table></section>"]
    return _page(f"perfdoctor history: {Path(str(view.script)).name}", body)
