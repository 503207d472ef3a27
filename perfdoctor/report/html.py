"""The HTML report: one self-contained page (its CSS and a few lines of optional JS for the
expand-all toggle, package files in report/assets/ inlined into the page; charts drawn as SVG by
report/charts.py), no network access, readable offline and in a CI artifact
viewer. Renders only; never measures: every number comes from the Report, the gate's Comparison
and its run records.

Every string that came from input (paths, trace and device names, code lines, finding and rule text)
goes through `_e` (`perfdoctor.report.escape.html_text`: control characters dropped, then
html.escape) before it reaches the page; numbers are formatted here. Key numbers
also sit in `<data value="...">` elements with the report's own unrounded value, so that a test (or
a script) reads the page's numbers back and checks them against report.json.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msgspec import UnsetType

from perfdoctor import __version__
from perfdoctor.contracts.report import BreakdownDoc, ComputeDoc
from perfdoctor.gate.compare import LEVEL
from perfdoctor.model import NO_FINDINGS, NOTHING_MEASURED, RANK_COLUMNS, Finding, Hotspot, Report, RuleDoc
from perfdoctor.report import charts, escape
from perfdoctor.report.common import ended_early, gate_value, new_not_failing, pct, target_of
from perfdoctor.report.explain import explanation_lines
from perfdoctor.report.memory import compute_line
from perfdoctor.stats import ms_text

if TYPE_CHECKING:
    from perfdoctor.gate.compare import Comparison

# the baseline's and the current side's run records, for the gate's step-time distributions

PERFETTO = "https://ui.perfetto.dev"
VERDICT_CLASS = {"regression": "bad", "improvement": "good", "no-change": "", "inconclusive": "warn",
                 "unstable": "warn", "not-comparable": "warn", "failed": "bad", "passed": "good", "undecided": "warn",
                 "host-contention": "warn"}


def _e(v: Any) -> str:
    """Text from input, safe in element content and in quoted attributes."""
    return escape.html_text(v)


def _data(key: str, value: Any, shown: str) -> str:
    """A number shown rounded, with the report's own value for machines."""
    return f'<data data-key="{_e(key)}" value="{_e(value)}">{_e(shown)}</data>'


def _fact(report: Report, name: str) -> Any:
    f = report.facts.get(name)
    return None if f is None else f.value


def _short(path: str) -> str:
    """A path relative to the current folder where it lies below it (as the text report shows it)."""
    try:
        rel = Path(path).resolve().relative_to(Path.cwd())
        return str(rel)
    except (ValueError, OSError):
        return path


def _safe_url(url: str) -> str | None:
    """A link target only for web addresses: never javascript: or data: URLs from a rule file."""
    return url if url.startswith(("https://", "http://")) else None


# -- SVG building blocks ---------------------------------------------------------------------------


# -- the step-time chart ----------------------------------------------------------------------------


# -- stacked bars -------------------------------------------------------------------------------------


def _breakdown(rows: list[BreakdownDoc], key: str, label: str) -> str:
    parts = []
    for i, b in enumerate(rows):
        ms = b.ms or 0.0
        if ms > 0:
            shown = (_data(f"summary.{key}.{i}.ms", b.ms, ms_text(ms))
                     + f" ({_e(pct(b.fraction))})")
            parts.append((b.category, float(ms), shown))
    return charts.stacked_bar(parts, label)


def _gpu_summary(report: Report) -> str:
    """Busy and idle (host wait vs the rest), and communication exposed vs overlapped: GPU traces only."""
    step, idle = _fact(report, "step.time_ms"), _fact(report, "step.idle_ms")
    host, gap = _fact(report, "gpu.idle_host_wait_ms"), _fact(report, "gpu.idle_gap_ms")
    if not all(isinstance(v, (int, float)) for v in (step, idle, host, gap)):
        return ""
    util = _fact(report, "gpu.utilization")
    out = ['<h3>GPU timeline per step</h3>',
           f'<p>The GPU is busy {_data("facts.gpu.utilization", util, pct(util))} of a step (median); '
           f'while it idles, the host has not launched the next work yet for '
           f'{_data("facts.gpu.idle_host_wait_ms", host, ms_text(host))} per step, and waits on something else '
           f'(a copy, a synchronisation, another stream) for {_data("facts.gpu.idle_gap_ms", gap, ms_text(gap))}.</p>']
    busy = max(0.0, step - idle)
    out.append(charts.stacked_bar([("GPU busy (kernels, copies, communication)", busy, _e(ms_text(busy))),
                             ("GPU idle: waiting for the host to launch work", host, _e(ms_text(host))),
                             ("GPU idle: other gaps", gap, _e(ms_text(gap)))],
                            "GPU busy and idle time per step, in ms"))
    share, overlap = _fact(report, "comm.share"), _fact(report, "comm.overlap")
    if isinstance(share, (int, float)) and share > 0 and isinstance(overlap, (int, float)):
        out.append(f'<p>Communication takes {_data("facts.comm.share", share, pct(share))} of the GPU\'s busy '
                   f'time; {_data("facts.comm.overlap", overlap, pct(overlap))} of it overlaps with compute '
                   f'kernels on other streams, the rest is exposed (the step waits for it).</p>')
        out.append(charts.stacked_bar([("compute, copies", (1 - share) * 100, _e(pct(1 - share))),
                                 ("communication overlapped with compute", share * overlap * 100,
                                  _e(pct(share * overlap))),
                                 ("communication exposed", share * (1 - overlap) * 100, _e(pct(share * (1 - overlap))))],
                                "Share of GPU busy time: compute, and communication overlapped or exposed", unit="%"))
    return "".join(out)


# -- ranks ------------------------------------------------------------------------------------------------

_RANK_SHOWN = ("step_ms", "compute_ms", "idle_ms", "idle_fraction")  # the columns every rank table has


def _rank_cell(v: Any, kind: str) -> str:
    if kind == "str" or not isinstance(v, (int, float)):
        return f"<td>{_e('' if v is None else v)}</td>"
    shown = pct(v) if kind == "share" else ms_text(v) if kind == "ms" else f"{v:.0f} MHz" if kind == "MHz" \
        else f"{v:,.0f} MiB" if kind == "MiB" else f"{v:.1f}"
    return f'<td class="n">{_e(shown)}</td>'


def _ranks(report: Report) -> str:
    rows = report.ranks
    if not rows:
        return ""
    straggler = _fact(report, "ranks.straggler")
    top = max((r.step_ms or 0) for r in rows)
    if top <= 0:
        return ""
    ticks = charts.axis_ticks(top, 6)
    L, R, T, rh = 110, 20, 10, 24  # left and right margins, top, row height
    W, pw = charts.CHART_W, charts.CHART_W - L - R
    H = T + rh * len(rows) + 40
    out = []
    for j, r in enumerate(rows):
        yy = T + j * rh
        step = r.step_ms or 0.0
        compute = r.compute_ms or 0.0
        idle = r.idle_ms or 0.0
        other = max(0.0, step - compute - idle)
        x0 = float(L)
        for i, (name, v) in enumerate((("GPU compute", compute), ("GPU idle", idle), ("rest of the step", other))):
            w = v / ticks[-1] * pw
            out.append(f'<rect class="seg" x="{x0:.2f}" y="{yy + 3}" width="{w:.2f}" height="{rh - 6}" '
                       f'fill="{charts.fill(i)}" stroke="#fff"><title>rank {_e(r.rank)}: {name} {_e(ms_text(v))}'
                       f'</title></rect>')
            x0 += w
        is_str = straggler is not None and r.rank == straggler
        if is_str:
            out.append(f'<rect class="straggler" x="{L - 2}" y="{yy + 1}" width="{step / ticks[-1] * pw + 4:.2f}" '
                       f'height="{rh - 2}"/>')
        out.append(f'<text class="tick{" strong" if is_str else ""}" x="{L - 6}" y="{yy + rh / 2 + 4}" '
                   f'text-anchor="end">{"straggler ▸ " if is_str else ""}rank {_e(r.rank)}</text>')
    for t in ticks:
        tx = L + t / ticks[-1] * pw
        out.append(f'<line class="grid" x1="{tx:.1f}" x2="{tx:.1f}" y1="{T}" y2="{T + rh * len(rows)}"/>'
                   f'<text class="tick" x="{tx:.1f}" y="{T + rh * len(rows) + 14}" text-anchor="middle">{charts.num(t)}</text>')
    out.append(f'<text class="label" x="{L + pw / 2}" y="{H - 6}" text-anchor="middle">median step time per rank (ms)'
               f'</text>')
    legend = "".join(f"<li>{charts.swatch(i)}{n}</li>" for i, n in enumerate(("GPU compute", "GPU idle",
                                                                         "rest of the step (communication, copies, CPU)")))
    # step, compute, idle and idle share always; the other columns where some rank has a value
    extra = [c for c in RANK_COLUMNS if c[0] not in _RANK_SHOWN and any(r.value(c[0]) is not None for r in rows)]
    table = ['<table><thead><tr><th>rank</th><th>file</th><th class="n">step</th><th class="n">GPU compute</th>'
             '<th class="n">GPU idle</th><th class="n">idle share</th>'
             + "".join(("<th>" if kind == "str" else '<th class="n">') + f"{_e(label)}</th>" for _, label, kind in extra)
             + '</tr></thead><tbody>']
    for j, r in enumerate(rows):
        table.append(f'<tr{" class=strong" if r.rank == straggler else ""}><td>{_e(r.rank)}</td>'
                     f'<td><code>{_e(r.file)}</code></td>'
                     f'<td class="n">{_data(f"ranks.{j}.step_ms", r.step_ms, ms_text(r.step_ms))}</td>'
                     f'<td class="n">{_e(ms_text(r.compute_ms))}</td><td class="n">{_e(ms_text(r.idle_ms))}</td>'
                     f'<td class="n">{_e(pct(r.idle_fraction))}</td>'
                     + "".join(_rank_cell(r.value(key), kind) for key, _, kind in extra) + '</tr>')
    table.append("</tbody></table>")
    imb = _fact(report, "ranks.imbalance_ratio")
    p = _fact(report, "ranks.imbalance_p")
    head = (f'<p>{len(rows)} ranks; the slowest sets the pace of every synchronous step.'
            + (f' Rank {_e(straggler)} is the straggler (imbalance: the slowest is '
               f'{_data("facts.ranks.imbalance_ratio", imb, f"{imb:.2f}×")} the median).' if straggler is not None
               and isinstance(imb, (int, float)) else "")
            + (f' No rank is a straggler: the gaps between them are within the noise of their steps '
               f'(p = {_data("facts.ranks.imbalance_p", p, f"{p:.2f}")}).'
               if straggler is None and isinstance(p, (int, float)) else "") + "</p>")
    return ('<section id="ranks"><h2>Ranks</h2>' + head
            + charts.svg(W, H, "Median step time per rank, split into GPU compute, GPU idle and the rest", "".join(out))
            + f'<ul class="legend">{legend}</ul>' + "".join(table) + "</section>")


# -- findings -------------------------------------------------------------------------------------------

def _diff(fix) -> str:
    before, after = (fix.before or "").splitlines(), (fix.after or "").splitlines()
    indent = min((len(l) - len(l.lstrip()) for l in before + after if l.strip()), default=0)
    lines = [f'<span class="del">- {_e(l[indent:])}</span>' for l in before]
    lines += [f'<span class="add">+ {_e(l[indent:])}</span>' for l in (after or ([""] if before else []))]
    head = "Fix, for example:" if fix.example else "Fix:"
    note = f'<p class="note">{_e(fix.note)}</p>' if fix.note else ""
    diff = f'<pre class="diff">{"".join(lines)}</pre>' if lines else ""  # a note-only fix has no diff
    return f'<div class="fix"><p><strong>{head}</strong></p>{diff}{note}</div>'


def _paras(text: str) -> str:
    return "".join(f"<p>{_e(p.strip())}</p>" for p in text.split("\n\n") if p.strip())


def _explain(rule: RuleDoc | None, finding: Finding) -> str:
    """`perfdoctor explain RULE`, one click away (the report's own copy of the rule's documentation)."""
    parts = []
    if rule is not None:
        d = rule
        parts += [f"<p><em>{_e(rule.summary)}</em> (severity: {_e(rule.severity)})</p>",
                  "<h4>What it does</h4>", _paras(d.what), "<h4>Why is this bad?</h4>", _paras(d.why)]
        if d.example:
            parts += ["<h4>Example</h4>", f"<pre>{_e(d.example)}</pre>"]
        if d.use_instead:
            parts += ["<h4>Use instead</h4>", f"<pre>{_e(d.use_instead)}</pre>"]
        if d.fix_safety:
            parts += ["<h4>Fix safety</h4>", _paras(d.fix_safety)]
        parts += ["<h4>When it fires</h4>", f"<pre>{_e(rule.when)}</pre>"]
        if rule.lets:
            parts.append("<p>where</p><pre>" + "\n".join(f"let.{_e(k)} = {_e(v)}" for k, v in rule.lets.items()) + "</pre>")
        if rule.thresholds:
            parts += ["<h4>Options</h4>", f"<p>Set in <code>pyproject.toml</code> under "
                      f"<code>[tool.perfdoctor.thresholds.{_e(rule.id)}]</code>:</p><ul>"
                      + "".join(f"<li><code>{_e(k)}</code> = {_e(repr(v))}</li>" for k, v in rule.thresholds.items())
                      + "</ul>"]
        refs = d.references
    else:
        parts.append(_paras(finding.why))
        refs = finding.references
    if refs:
        items = []
        for u in refs:
            safe = _safe_url(u)
            items.append(f'<li><a href="{_e(safe)}">{_e(u)}</a></li>' if safe else f"<li>{_e(u)}</li>")
        parts += ["<h4>References</h4>", f"<ul>{''.join(items)}</ul>"]
    return (f'<details class="explain"><summary>Why, an example and the fix in general '
            f'(<code>perfdoctor explain {_e(finding.rule)}</code>)</summary>{"".join(parts)}</details>')


def _value(v: Any, unit: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return _e(v)
    if unit == "ms":
        return _e(ms_text(v))
    if unit == "ratio":
        return _e(pct(v))
    if unit == "bytes":
        return _e(f"{v / 2**20:.1f} MiB")
    return _e(f"{v:.4g}" if isinstance(v, float) else v) + (f" {_e(unit)}" if unit and unit != "count" else "")


def _verified(f: Finding, step_ms: Any) -> str:
    """`perfdoctor verify`'s result: its sentence, and the predicted and measured savings on one bar (the
    measured one's interval as a whisker), both as shares of the original's step."""
    v = f.verification
    assert v is not None
    out = f'<br><span class="verified verdict-{_e(v.verdict)}">{_e(v.sentence())}</span>'
    scale = v.step_ms if v.step_ms else step_ms
    if v.measured_ms_per_step is None or not isinstance(scale, (int, float)) or scale <= 0:
        return out

    def x(ms: float) -> float:
        return max(0.0, min(1.0, ms / scale)) * 300

    bars = ['<rect width="300" height="16" fill="#e6e6e6"/>']
    if f.ms_per_step is not None:
        bars.append(f'<rect y="0" width="{x(f.ms_per_step):.1f}" height="7" fill="{charts.fill(0)}"><title>predicted '
                    f'{_e(ms_text(f.ms_per_step))}</title></rect>')
    bars.append(f'<rect y="9" width="{x(v.measured_ms_per_step):.1f}" height="7" fill="{charts.fill(1)}"><title>measured '
                f'{_e(ms_text(v.measured_ms_per_step))}</title></rect>')
    if v.interval_ms is not None:
        lo, hi = x(v.interval_ms[0]), x(v.interval_ms[1])
        bars.append(f'<line x1="{lo:.1f}" x2="{hi:.1f}" y1="12.5" y2="12.5" stroke="#000" stroke-width="1.5"/>')
    return (out + '<br><svg class="chart savebar" role="img" aria-label="predicted (top) and measured (bottom) '
            'saving as shares of the step" viewBox="0 0 300 16" width="300" height="16">' + "".join(bars) + "</svg>")


def _finding(i: int, f: Finding, rule: RuleDoc | None, step_ms: Any) -> str:
    if f.ms_per_step is not None:
        cost = (f'<span class="saving">saves ~{_data(f"findings.{i - 1}.estimated_saving.ms_per_step", round(f.ms_per_step, 3), ms_text(f.ms_per_step))}'
                f'/step' + (f" ({pct(f.fraction_of_step)} of the step)" if f.fraction_of_step is not None else "")
                + "</span>")
        bar = ""
        if isinstance(step_ms, (int, float)) and step_ms > 0:
            w = min(1.0, round(f.ms_per_step, 3) / step_ms) * 300  # as report.json holds it
            bar = (f'<svg class="chart savebar" role="img" aria-label="saving as a share of the median step" '
                   f'viewBox="0 0 300 10" width="300" height="10"><rect width="300" height="10" fill="#e6e6e6"/>'
                   f'<rect width="{w:.1f}" height="10" fill="{charts.fill(0)}"/></svg>')
        cost += bar
    else:
        cost = '<span class="unmeasured">cost not measured here</span>'
    if f.verification is not None:
        cost += _verified(f, step_ms)
    locs = "".join(f'<li><code class="where">{_e(_short(l.file))}:{l.line}</code>'
                   + (f' <code class="code">{_e(l.code)}</code>' if l.code else "") + "</li>" for l in f.locations[:10])
    out = [f'<article class="finding sev-{_e(f.severity)}" id="finding-{i}">',
           f'<h3><span class="num">{i}.</span> {_e(f.rule)} {_e(f.name)} '
           f'<span class="sev">{_e(f.severity.upper())}</span></h3>',
           f'<p class="cost">{cost}</p>', f'<p class="title"><strong>{_e(f.title)}</strong></p>']
    if locs:
        out.append(f'<ul class="locations">{locs}</ul>')
    out.append(f"<p>{_e(f.message)}</p>")
    if f.ms_per_step is None and f.saving_basis:
        out.append(f'<p class="note">({_e(f.saving_basis)})</p>')
    if f.fix and (f.fix.before or f.fix.after or f.fix.note):
        out.append(_diff(f.fix))
    if f.evidence:
        rows = "".join(f"<tr><td><code>{_e(ev.name)}</code></td><td class=\"n\">{_value(ev.value, ev.unit)}</td>"
                       f"<td>{_e(ev.source)}</td><td>{_e(ev.detail)}</td></tr>" for ev in f.evidence)
        out.append('<details class="evidence"><summary>Evidence</summary><table><thead><tr><th>fact</th>'
                   f'<th class="n">value</th><th>source</th><th>how measured</th></tr></thead><tbody>{rows}'
                   "</tbody></table></details>")
    out.append(f'<p class="note">confidence {_e(f.confidence)}</p>')
    out.append(_explain(rule, f))
    out.append("</article>")
    return "".join(out)


def _findings(report: Report) -> str:
    if not report.findings:
        said = f'<p class="note">{_e(NOTHING_MEASURED)}</p>' if report.measured_nothing else \
            f'<p class="good">{_e(NO_FINDINGS)}</p>'
        return f'<section id="findings"><h2>Findings</h2>{said}</section>'
    by_id = {r.id: r for r in report.rules}
    step = report.summary.step_time_ms.median if report.summary.step_time_ms else None
    body = "".join(_finding(i, f, by_id.get(f.rule), step) for i, f in enumerate(report.findings, 1))
    return (f'<section id="findings"><h2>Findings <span class="dim">({len(report.findings)}, most costly first)'
            f'</span></h2><p><button type="button" id="toggle-explain" hidden>Expand every explanation</button></p>'
            f'<div class="cards">{body}</div></section>')


def _findings_table(report: Report) -> str:
    """The findings at a glance, at the top: one row each (rule, severity, saving, where; a finding
    found at several lines says how many more), each linking to its card."""
    if not report.findings:
        return ""
    rows = []
    for i, f in enumerate(report.findings, 1):
        saving = f"{ms_text(f.ms_per_step)}/step" if f.ms_per_step is not None else '<span class="dim">not measured here</span>'
        loc = f.locations[0] if f.locations else None
        where = "" if loc is None else f"<code>{_e(_short(loc.file))}:{loc.line}</code>" + (
            f' <span class="dim">and {len(f.locations) - 1} more</span>' if len(f.locations) > 1 else "")
        rows.append(f'<tr class="sev-{_e(f.severity)}"><td class="n">{i}</td><td><a href="#finding-{i}">{_e(f.rule)} '
                    f'{_e(f.name)}</a><br><span class="dim">{_e(f.title)}</span></td><td>{_e(f.severity)}</td>'
                    f'<td class="n">{saving}</td><td>{where}</td></tr>')
    return ('<section id="summary"><h2>At a glance</h2><table class="glance"><thead><tr><th class="n">#</th>'
            '<th>rule</th><th>severity</th><th class="n">saving</th><th>location</th></tr></thead><tbody>'
            + "".join(rows) + "</tbody></table></section>")


def _nav(report: Report, comparison: Comparison | None) -> str:
    """Links to every section, so the hot spots and the notes are a click away, not past every card."""
    links = [("summary", "at a glance", bool(report.findings)), ("steps", "step time", bool(report.summary.step_series)),
             ("ranks", "ranks", bool(report.ranks)), ("findings", "findings", True),
             ("hotspots", "hot spots", bool(report.hotspots)), ("gate", "gate", comparison is not None),
             ("notes", "notes", bool(report.notes)), ("facts", "facts", bool(report.facts))]
    return '<nav class="toc">' + " · ".join(f'<a href="#{a}">{t}</a>' for a, t, shown in links if shown) + "</nav>"


# -- hot spots ------------------------------------------------------------------------------------------

def _hotspot_table(hs: list[tuple[int, Hotspot]], top: float) -> str:
    """Hot spots with their index in the report's list (the key of their numbers)."""
    rows = []
    for k, h in hs:
        w = 0 if top <= 0 else round(h.ms_per_step, 3) / top * 120  # as report.json holds it
        lines = "".join(f'<li><code>{_e(l.line)}: {_e(l.code)}</code> '
                        f'<span class="dim">({_e(pct(l.share))})</span></li>' for l in h.lines[:3])
        ms = _data(f"hotspots.{k}.ms_per_step", round(h.ms_per_step, 3), f"{h.ms_per_step:.2f}")
        rows.append(f"<tr><td><code>{_e(h.function)}</code></td><td><code>{_e(_short(h.file))}:{h.line}</code></td>"
                    f'<td class="n">{ms} <svg class="chart inline" role="img" aria-label="ms per step" '
                    f'viewBox="0 0 120 10" width="120" height="10"><rect width="{w:.1f}" height="10" '
                    f'fill="{charts.fill(0)}"/></svg></td><td><ul class="lines">{lines}</ul></td></tr>')
    return ('<table class="hot"><thead><tr><th>function</th><th>where</th><th class="n">ms/step</th>'
            f'<th>hot lines (share of the function\'s self time: time in the functions a line calls is theirs)</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')


def _hotspots(report: Report) -> str:
    if not report.hotspots:
        return ""
    top = max(round(h.ms_per_step, 3) for h in report.hotspots)
    out = ['<section id="hotspots"><h2>Hot spots in your code <span class="dim">(profiled steps)</span></h2>']
    for proc, title in (("main", "Main process"), ("dataloader-workers", "DataLoader workers (py-spy)")):
        hs = [(k, h) for k, h in enumerate(report.hotspots) if h.process == proc][:10]
        if hs:
            out += [f"<h3>{title}</h3>", _hotspot_table(hs, top)]
    out.append("</section>")
    return "".join(out)


# -- the gate ---------------------------------------------------------------------------------------------


def _gate(c: Comparison) -> str:
    verdict = c.verdict
    out = [f'<section id="gate"><h2>Gate: <span class="verdict {VERDICT_CLASS.get(verdict, "")}">'
           f'{_e(verdict.upper())}</span></h2>',
           f'<p>Threshold {_data("gate.max_regression", c.max_regression, f"{c.max_regression:.0%}")}; '
           f'{c.baseline_runs} baseline run(s) against {c.current_runs} current run(s).</p>']
    timing = next((r for r in c.rows if r.kind == "timing"), None)
    if timing is not None:
        if timing.change_pct is not None:
            ci = (f", {LEVEL:.0%} interval {timing.ci_pct[0]:+.1f}%..{timing.ci_pct[1]:+.1f}%"
                  if timing.ci_pct else ", no interval")
            out.append(f'<p>{_e(timing.metric)}: {_e(ms_text(timing.baseline))} → {_e(ms_text(timing.current))}, '
                       f'{_data(f"gate.rows.{c.rows.index(timing)}.change_pct", round(timing.change_pct, 2), f"{timing.change_pct:+.1f}%")}'
                       f'{ci}: <span class="verdict {VERDICT_CLASS.get(timing.verdict, "")}">{_e(timing.verdict)}'
                       f'</span></p>')
        out.append(charts.interval(timing, c.max_regression, LEVEL))
    if c.sides[0] and c.sides[1]:
        out += ["<h3>Step-time distributions</h3>", charts.distributions(c.sides)]
    rows = []
    for r in c.rows:
        ci = f"{r.ci_pct[0]:+.1f}%..{r.ci_pct[1]:+.1f}%" if r.ci_pct else ""
        rows.append(f"<tr><td>{_e(r.metric)}</td><td class=\"n\">{_e(gate_value(r.baseline, r.unit))}</td>"
                    f"<td class=\"n\">{_e(gate_value(r.current, r.unit))}</td>"
                    f"<td class=\"n\">{'' if r.change_pct is None else f'{r.change_pct:+.1f}%'}</td>"
                    f"<td class=\"n\">{_e(ci)}</td><td><span class=\"verdict {VERDICT_CLASS.get(r.verdict, '')}\">"
                    f"{_e(r.verdict)}</span></td></tr>")
    out.append(f'<table><thead><tr><th>metric</th><th class="n">baseline</th><th class="n">current</th>'
               f'<th class="n">change</th><th class="n">{LEVEL:.0%} interval</th><th>verdict</th></tr></thead>'
               f'<tbody>{"".join(rows)}</tbody></table>')
    for title, items, cls in (("New findings that fail the gate", c.failing_findings, "bad"),
                              ("New findings", new_not_failing(c), "warn"),
                              ("Findings resolved since the baseline", c.resolved_findings, "good")):
        if items:
            out.append(f'<h3>{title}</h3><ul class="{cls}">'
                       + "".join(f"<li>{_e(f.rule)} {_e(f.title)}</li>" for f in items) + "</ul>")
    why = explanation_lines(c.explanation)
    if why:
        out.append('<h3>Why it changed</h3><ul class="why">' + "".join(f"<li>{_e(x)}</li>" for x in why) + "</ul>")
    out.append(_notes(c.notes))
    out.append("</section>")
    return "".join(out)


# -- the page -------------------------------------------------------------------------------------------

def _notes(notes: Iterable[str]) -> str:
    notes = list(notes)
    if not notes:
        return ""
    return '<div class="notes" id="notes"><h3>Notes</h3><ul>' + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul></div>"


def _perfetto(files: list[str]) -> str:
    if not files:
        return ""
    names = ", ".join(f"<code>{_e(_short(f))}</code>" for f in files)
    return (f'<p class="perfetto">Open the trace in <a href="{PERFETTO}" target="_blank" rel="noopener">'
            f'Perfetto ({PERFETTO})</a>: choose <em>Open trace file</em> and load {names}. '
            f'It stays on your machine: Perfetto reads it in the browser.</p>')


def _header(report: Report) -> str:
    run, s = report.run, report.summary
    rows = [("analysed", f"<code>{_e(_short(str(target_of(run))))}</code>")]
    if run.label:
        rows.append(("ranks", _e(run.label)))
    if run.device:
        rows.append(("device", _e(run.device)))
    if run.torch:
        rows.append(("torch", _e(run.torch)))
    if s.steps_observed is not None:
        clock = run.step_clock or s.step_clock or ""
        rows.append(("steps", f'{_data("summary.steps_observed", s.steps_observed, str(s.steps_observed))} seen, '
                              f'{_e(s.steps_profiled or 0)} profiled'
                     + (f" (counted by {_e(clock)})" if clock else "")))
    st = s.step_time_ms
    if st is not None and st.median is not None:
        rows.append(("step time", f'median {_data("summary.step_time_ms.median", st.median, ms_text(st.median))}, '
                                  f'p90 {_data("summary.step_time_ms.p90", st.p90, ms_text(st.p90))}'
                     + (f" over {_e(st.n)} steady-state steps" if st.n else "")))
    ended = ended_early(run)
    if ended:
        rows.append(("script", f'<span class="bad">{_e(ended[0])} (exit code {_e(ended[1])})</span>'))
    if run.run_dir:
        rows.append(("run folder", f"<code>{_e(_short(run.run_dir))}</code>"))
    files = [run.trace_file] if run.trace_file else list(run.files or [])
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    return f'<header><h1>perfdoctor report</h1><dl class="run">{dl}</dl>{_perfetto(files)}</header>'


def _modules_table(compute: ComputeDoc | None) -> str:
    """The modules with the most FLOPs (summary.compute.modules): FLOPs, share, and the forward's time and rate."""
    rows = compute.modules if compute is not None else []
    if not rows:
        return ""
    out = ['<table id="compute-modules"><thead><tr><th>module</th><th class="n">FLOPs per step</th>'
           '<th class="n">share</th><th class="n">forward ms</th><th class="n">forward FLOP/s</th></tr></thead><tbody>']
    for r in rows:
        rate = None if isinstance(r.achieved_flops, UnsetType) else r.achieved_flops
        ms = None if isinstance(r.forward_ms, UnsetType) else r.forward_ms
        out.append(f'<tr><td>{_e(r.module)}</td><td class="n">{r.flops:,.0f}</td><td class="n">{r.share:.1%}</td>'
                   f'<td class="n">{_e(ms_text(ms))}</td>'
                   f'<td class="n">{"" if rate is None else f"{rate:,.4g}"}</td></tr>')
    return "".join(out) + "</tbody></table>"


def _step_section(report: Report) -> str:
    s = report.summary
    parts = []
    chart = charts.step_chart(s)
    if chart:
        parts.append('<section id="steps"><h2>Step time over the run</h2>' + chart + "</section>")
    mem = charts.memory_chart(s.memory) if s.memory else ""
    if mem:
        parts.append('<section id="memory"><h2>Memory over the run</h2>' + mem + "</section>")
    compute = compute_line(lambda n: report.facts[n].value if n in report.facts else None, s.compute or None)
    if compute:
        mfu, flops = report.facts.get("compute.mfu"), report.facts.get("compute.flops_per_step")
        parts.append('<section id="compute"><h2>Compute efficiency</h2>'
                     + "<p>" + _data("compute.mfu", None if mfu is None else round(mfu.value, 6), compute) + "</p>"
                     + (f'<p class="formula">{_e(mfu.detail)}</p>' if mfu is not None else "")
                     + (f'<p class="dim">{_e(flops.detail)}</p>' if flops is not None else "")
                     + _modules_table(s.compute or None) + "</section>")
    bd = []
    if s.breakdown:
        gpu_trace = report.run.kind == "trace" and _fact(report, "step.gpu_kernel_ms") is not None
        bd.append(_breakdown(s.breakdown, "breakdown",
                             "Where the median step goes, in ms" + (" (GPU timeline)" if gpu_trace else "")))
    if s.gpu_breakdown:
        bd += ["<h3>GPU timeline per step</h3>",
               _breakdown(s.gpu_breakdown, "gpu_breakdown", "Where the median step goes on the GPU, in ms")]
    bd.append(_gpu_summary(report))
    if s.contention and s.contention.inflated:
        bd.insert(0, f'<p class="warn">{_e(s.contention.sentence or "")}</p>')
    if any(bd):
        parts.append('<section id="breakdown"><h2>Where a step goes <span class="dim">(median step)</span></h2>'
                     + "".join(bd) + "</section>")
    return "".join(parts)


def _facts_table(report: Report) -> str:
    if not report.facts:
        return ""
    rows = "".join(f"<tr><td><code>{_e(n)}</code></td><td class=\"n\">{_value(f.value, f.unit)}</td><td>{_e(f.source)}"
                   f"</td><td>{_e(f.detail)}</td></tr>" for n, f in sorted(report.facts.items()))
    return ('<section id="facts"><details><summary>Every measured fact</summary><table><thead><tr><th>fact</th>'
            f'<th class="n">value</th><th>source</th><th>how measured</th></tr></thead><tbody>{rows}</tbody></table>'
            "</details></section>")


def _asset(name: str) -> str:
    """A file of the page's own (report/assets/: shipped in the package), inlined into every page."""
    return (resources.files("perfdoctor.report") / "assets" / name).read_text(encoding="utf-8")


# the page's style, and the few lines of script that expand or collapse every rule explanation at
# once (the page reads fine without it)
CSS = _asset("report.css")
JS = _asset("report.js")

# nothing on the page may reach the network: no fetches, images or fonts from anywhere
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


def _page(title: str, body: list[str]) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>{charts.defs()}<main>{''.join(body)}"
            f'<footer>perfdoctor {_e(__version__)}: a self-contained page; the charts are SVG drawn from '
            f"report.json's numbers.</footer></main><script>{JS}</script></body></html>\n")


def render_report(report: Report, comparison: Comparison | None = None) -> str:
    """The report as one HTML page; with the gate's `comparison`, the verdict and the two sides' step
    times follow the report. The explanations are the report's own (`Report.rules`)."""
    target = target_of(report.run)
    body = [_header(report), _nav(report, comparison), _findings_table(report), _step_section(report), _ranks(report),
            _findings(report), _hotspots(report)]
    if comparison is not None:
        body.append(_gate(comparison))
    body += [_notes(report.notes), _facts_table(report)]
    return _page(f"perfdoctor: {Path(str(target)).name}", body)


def render_both(report: Report, comparison: Comparison) -> str:
    return render_report(report, comparison)


def render_comparison(comparison: Comparison) -> str:
    """`perfdoctor compare --format html`: the verdict, its interval and the two sides' step times."""
    return _page("perfdoctor gate", ['<header><h1>perfdoctor gate</h1></header>', _gate(comparison)])
