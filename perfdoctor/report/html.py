"""The HTML report: one self-contained page (inline CSS, charts drawn here as SVG, a few lines of
optional JS for the expand-all toggle), no network access, readable offline and in a CI artifact
viewer. Renders only; never measures: every number comes from the Report, the gate's Comparison
and its run records.

Every string that came from input (paths, trace and device names, code lines, finding and rule text)
goes through `_e` (`perfdoctor.report.escape.html_text`: control characters dropped, then
html.escape) before it reaches the page; numbers are formatted here. Key numbers
also sit in `<data value="...">` elements with the report's own unrounded value, so that a test (or
a script) reads the page's numbers back and checks them against report.json.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfdoctor import __version__
from perfdoctor.model import NO_FINDINGS, NOTHING_MEASURED, RANK_COLUMNS, Finding, Hotspot, Report, RuleDoc
from perfdoctor.report import escape
from perfdoctor.report.explain import explanation_lines
from perfdoctor.report.memory import memory_line
from perfdoctor.report.text import chart_top

if TYPE_CHECKING:
    from perfdoctor.gate.baseline import RunRecord
    from perfdoctor.gate.compare import Comparison

# the baseline's and the current side's run records, for the gate's step-time distributions

PERFETTO = "https://ui.perfetto.dev"
CHART_W = 760
# Fills for the parts of a bar: lightness alternates from one to the next and every other fill
# carries a pattern, so neighbours stay apart in grey and for colour-blind readers.
FILLS = [("#1d4e89", None), ("#f6b26b", None), ("#3a9e8f", "stripes"), ("#d9d9d9", "dots"),
         ("#6a3d9a", None), ("#a6cee3", "cross"), ("#8c510a", "stripes"), ("#fde68a", None),
         ("#555555", "dots")]
VERDICT_CLASS = {"regression": "bad", "improvement": "good", "no-change": "", "inconclusive": "warn",
                 "unstable": "warn", "not-comparable": "warn", "failed": "bad", "passed": "good", "undecided": "warn"}


def _e(v: Any) -> str:
    """Text from input, safe in element content and in quoted attributes."""
    return escape.html_text(v)


def _ms(v: Any) -> str:
    """A duration as the text report writes it (the same rounding, so the two reports agree)."""
    if not isinstance(v, (int, float)):
        return "n/a"
    return f"{v:.0f} ms" if v >= 100 else f"{v:.1f} ms" if v >= 1 else f"{v * 1000:.0f} µs"


def _data(key: str, value: Any, shown: str) -> str:
    """A number shown rounded, with the report's own value for machines."""
    return f'<data data-key="{_e(key)}" value="{_e(value)}">{_e(shown)}</data>'


def _pct(v: Any) -> str:
    return f"{v:.0%}" if isinstance(v, (int, float)) else "n/a"


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

def _defs() -> str:
    """The patterns every chart's fills may name (one hidden SVG; url(#id) reaches across the page)."""
    pats = []
    for i, (color, pat) in enumerate(FILLS):
        if pat is None:
            continue
        ink = "#ffffff" if i in (2, 6, 8) else "#333333"
        mark = {"stripes": f'<path d="M0 0 L0 6" stroke="{ink}" stroke-width="2"/>',
                "dots": f'<circle cx="3" cy="3" r="1.2" fill="{ink}"/>',
                "cross": f'<path d="M0 0 L0 6 M0 0 L6 0" stroke="{ink}" stroke-width="1.2"/>'}[pat]
        rot = ' patternTransform="rotate(45)"' if pat in ("stripes", "cross") else ""
        pats.append(f'<pattern id="fill{i}" patternUnits="userSpaceOnUse" width="6" height="6"{rot}>'
                    f'<rect width="6" height="6" fill="{color}"/>{mark}</pattern>')
    pats.append('<pattern id="hatch" patternUnits="userSpaceOnUse" width="8" height="8" '
                'patternTransform="rotate(45)"><rect width="8" height="8" fill="#eef2f7"/>'
                '<path d="M0 0 L0 8" stroke="#c5d0de" stroke-width="3"/></pattern>')
    return ('<svg class="defs" width="0" height="0" aria-hidden="true" focusable="false">'
            f'<defs>{"".join(pats)}</defs></svg>')


def _fill(i: int) -> str:
    color, pat = FILLS[i % len(FILLS)]
    return color if pat is None else f"url(#fill{i % len(FILLS)})"


def _swatch(i: int) -> str:
    return (f'<svg class="swatch" width="14" height="14" aria-hidden="true"><rect width="14" height="14" '
            f'fill="{_fill(i)}" stroke="#333" stroke-width="0.5"/></svg>')


def _ticks(hi: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least `hi` (steps of 1, 2 or 5 times a power of ten)."""
    if hi <= 0:
        return [0.0, 1.0]
    raw = hi / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    n = math.ceil(hi / step - 1e-9)
    return [i * step for i in range(n + 1)]


def _num(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e6 else f"{v:.3g}"


def _svg(w: int, h: int, label: str, body: str) -> str:
    return (f'<svg class="chart" role="img" aria-label="{_e(label)}" viewBox="0 0 {w} {h}" width="{w}" '
            f'height="{h}" xmlns="http://www.w3.org/2000/svg"><title>{_e(label)}</title>{body}</svg>')


# -- the step-time chart ----------------------------------------------------------------------------

def _step_chart(summary: dict[str, Any]) -> str:
    series = summary.get("step_series") or {}
    ms: list[float] = series.get("ms") or []
    if not ms:
        return ""
    n = len(ms)
    st = summary.get("step_time_ms") or {}
    top = chart_top(ms)
    ticks = _ticks(top)
    y_hi = ticks[-1]
    L, R, T, B = 64, 120, 24, 46
    W, H = CHART_W, 280
    pw, ph = W - L - R, H - T - B

    def x(i: float) -> float:  # step i (1-based) at the middle of its slot
        return L + (i - 0.5) / n * pw

    def y(v: float) -> float:
        return T + ph - min(v, y_hi) / y_hi * ph

    steady: set[int] = set()
    for lo, hi in series.get("steady") or []:
        steady.update(range(lo, hi + 1))
    out = []
    window = series.get("window")
    first_steady = min(steady) if steady else n + 1
    warm_end = min(first_steady, window[0] if window else n + 1) - 1
    if warm_end >= 1:
        out.append(f'<rect x="{L}" y="{T}" width="{warm_end / n * pw:.1f}" height="{ph}" fill="#f7f3e8"/>'
                   f'<text class="band" x="{L + 4}" y="{T + ph - 6}">warm-up</text>')
    if window:
        wx = L + (window[0] - 1) / n * pw
        out.append(f'<rect x="{wx:.1f}" y="{T}" width="{(window[1] - window[0] + 1) / n * pw:.1f}" height="{ph}" '
                   f'fill="url(#hatch)"><title>profiled window: steps {window[0]}-{window[1]}</title></rect>'
                   f'<text class="band" x="{wx + 4:.1f}" y="{T + 12}">profiled window</text>')
    # axes and grid
    for t in ticks:
        out.append(f'<line class="grid" x1="{L}" x2="{L + pw}" y1="{y(t):.1f}" y2="{y(t):.1f}"/>'
                   f'<text class="tick" x="{L - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{_num(t)}</text>')
    for t in _ticks(n, 8):
        if 1 <= t <= n:
            out.append(f'<text class="tick" x="{x(t):.1f}" y="{T + ph + 16}" text-anchor="middle">{int(t)}</text>')
    out.append(f'<line class="axis" x1="{L}" x2="{L + pw}" y1="{T + ph}" y2="{T + ph}"/>'
               f'<line class="axis" x1="{L}" x2="{L}" y1="{T}" y2="{T + ph}"/>'
               f'<text class="label" x="{L + pw / 2}" y="{H - 8}" text-anchor="middle">step</text>'
               f'<text class="label" transform="translate(16 {T + ph / 2}) rotate(-90)" '
               f'text-anchor="middle">step time (ms)</text>')
    # the steps: every step while they fit, else the slowest and fastest of each column of steps
    if n <= 600:
        pts = " ".join(f"{x(i + 1):.1f},{y(v):.1f}" for i, v in enumerate(ms))
        out.append(f'<polyline class="series" points="{pts}"/>')
        r = 3 if n <= 150 else 1.6
        for i, v in enumerate(ms, 1):
            tip = f"<title>step {i}: {_ms(v)}{'' if i in steady else ' (left out of the statistics)'}</title>"
            if v > y_hi:
                out.append(f'<path class="off" d="M{x(i) - 4:.1f},{T + 7} L{x(i):.1f},{T} L{x(i) + 4:.1f},{T + 7} Z">'
                           f'{tip}</path><text class="offlabel" x="{x(i) + 6:.1f}" y="{T + 8}">{_e(_ms(v))}</text>')
            else:
                cls = "pt" if i in steady else "pt out"
                out.append(f'<circle class="{cls}" cx="{x(i):.1f}" cy="{y(v):.1f}" r="{r}">{tip}</circle>')
    else:
        cols = 600
        per = math.ceil(n / cols)
        hi_pts, lo_pts = [], []
        for c in range(0, n, per):
            chunk = ms[c:c + per]
            xc = x(c + 1 + (len(chunk) - 1) / 2)
            hi_pts.append(f"{xc:.1f},{y(max(chunk)):.1f}")
            lo_pts.append(f"{xc:.1f},{y(min(chunk)):.1f}")
        out.append(f'<polygon class="band-series" points="{" ".join(hi_pts + lo_pts[::-1])}">'
                   f'<title>slowest and fastest step of every {per} steps</title></polygon>')
    # the statistics of the steady-state steps
    for key in ("median", "p90"):
        stat = st.get(key)
        if isinstance(stat, (int, float)):
            out.append(f'<line class="{key}" x1="{L}" x2="{L + pw}" y1="{y(stat):.1f}" y2="{y(stat):.1f}"/>')
    med, p90 = st.get("median"), st.get("p90")
    if isinstance(med, (int, float)) and isinstance(p90, (int, float)):
        ym, yp = y(med), y(p90)
        if abs(ym - yp) < 13:  # keep the two labels apart
            yp, ym = min(yp, ym - 13), max(ym, yp + 13) if yp >= ym - 13 else ym
        out.append(f'<text class="statlabel" x="{L + pw + 6}" y="{ym + 4:.1f}">median {_e(_ms(med))}</text>'
                   f'<text class="statlabel" x="{L + pw + 6}" y="{yp + 4:.1f}">p90 {_e(_ms(p90))}</text>')
    label = (f"Step time of each of the run's {n} steps, in ms, with the median and p90 of the steady-state steps")
    legend = ('<ul class="legend">'
              '<li><svg class="swatch" width="14" height="14" aria-hidden="true"><circle cx="7" cy="7" r="4" '
              'class="pt"/></svg>steady-state step (in the median and p90)</li>'
              '<li><svg class="swatch" width="14" height="14" aria-hidden="true"><circle cx="7" cy="7" r="4" '
              'class="pt out"/></svg>left out (warm-up, profiled window and the step after it)</li>'
              '<li><svg class="swatch" width="24" height="14" aria-hidden="true"><line x1="0" x2="24" y1="7" '
              'y2="7" class="median"/></svg>median</li>'
              '<li><svg class="swatch" width="24" height="14" aria-hidden="true"><line x1="0" x2="24" y1="7" '
              'y2="7" class="p90"/></svg>p90</li>'
              + ('<li><svg class="swatch" width="14" height="14" aria-hidden="true"><path class="off" '
                 'd="M3,12 L7,4 L11,12 Z"/></svg>off the scale (value written next to it)</li>'
                 if any(v > y_hi for v in ms) else "")
              + "</ul>")
    return _svg(W, H, label, "".join(out)) + legend


# -- stacked bars -------------------------------------------------------------------------------------

def _stacked_bar(parts: list[tuple[str, float, str]], label: str, unit: str = "ms", key: str = "") -> str:
    """One horizontal bar of parts (name, value, shown text), with an axis in `unit` and a legend."""
    parts = [p for p in parts if p[1] > 0]
    total = sum(p[1] for p in parts)
    if total <= 0:
        return ""
    L, R, W = 10, 20, CHART_W
    pw = W - L - R
    H = 66
    ticks = _ticks(total, 6) if unit == "ms" else [0, 25, 50, 75, 100]
    scale_hi = ticks[-1] if unit == "ms" else 100.0
    out, x0 = [], float(L)
    for i, (name, v, shown) in enumerate(parts):
        w = v / scale_hi * pw
        out.append(f'<rect class="seg" x="{x0:.2f}" y="8" width="{w:.2f}" height="30" fill="{_fill(i)}" '
                   f'stroke="#fff" stroke-width="1"><title>{_e(name)}: {_e(shown)}</title></rect>')
        x0 += w
    for t in ticks:
        tx = L + t / scale_hi * pw
        out.append(f'<line class="axis" x1="{tx:.1f}" x2="{tx:.1f}" y1="40" y2="44"/>'
                   f'<text class="tick" x="{tx:.1f}" y="56" text-anchor="middle">{_num(t)}</text>')
    out.append(f'<line class="axis" x1="{L}" x2="{L + pw}" y1="40" y2="40"/>'
               f'<text class="label" x="{L + pw}" y="66" text-anchor="end">{"ms per step" if unit == "ms" else "%"}'
               f'</text>')
    legend = "".join(f'<li>{_swatch(i)}{_e(name)} {shown_html}</li>'
                     for i, (name, _, shown_html) in enumerate((n, v, s) for n, v, s in parts))
    return _svg(W, H + 4, label, "".join(out)) + f'<ul class="legend">{legend}</ul>'


def _breakdown(rows: list[dict[str, Any]], key: str, label: str) -> str:
    parts = []
    for i, b in enumerate(rows):
        ms = b.get("ms") or 0.0
        if ms > 0:
            shown = (_data(f"summary.{key}.{i}.ms", b.get("ms"), _ms(ms))
                     + f" ({_e(_pct(b.get('fraction')))})")
            parts.append((str(b.get("category", "")), float(ms), shown))
    return _stacked_bar(parts, label)


def _gpu_summary(report: Report) -> str:
    """Busy and idle (host wait vs the rest), and communication exposed vs overlapped: GPU traces only."""
    step, idle = _fact(report, "step.time_ms"), _fact(report, "step.idle_ms")
    host, gap = _fact(report, "gpu.idle_host_wait_ms"), _fact(report, "gpu.idle_gap_ms")
    if not all(isinstance(v, (int, float)) for v in (step, idle, host, gap)):
        return ""
    util = _fact(report, "gpu.utilization")
    out = ['<h3>GPU timeline per step</h3>',
           f'<p>The GPU is busy {_data("facts.gpu.utilization", util, _pct(util))} of a step (median); '
           f'while it idles, the host has not launched the next work yet for '
           f'{_data("facts.gpu.idle_host_wait_ms", host, _ms(host))} per step, and waits on something else '
           f'(a copy, a synchronisation, another stream) for {_data("facts.gpu.idle_gap_ms", gap, _ms(gap))}.</p>']
    busy = max(0.0, step - idle)
    out.append(_stacked_bar([("GPU busy (kernels, copies, communication)", busy, _e(_ms(busy))),
                             ("GPU idle: waiting for the host to launch work", host, _e(_ms(host))),
                             ("GPU idle: other gaps", gap, _e(_ms(gap)))],
                            "GPU busy and idle time per step, in ms"))
    share, overlap = _fact(report, "comm.share"), _fact(report, "comm.overlap")
    if isinstance(share, (int, float)) and share > 0 and isinstance(overlap, (int, float)):
        out.append(f'<p>Communication takes {_data("facts.comm.share", share, _pct(share))} of the GPU\'s busy '
                   f'time; {_data("facts.comm.overlap", overlap, _pct(overlap))} of it overlaps with compute '
                   f'kernels on other streams, the rest is exposed (the step waits for it).</p>')
        out.append(_stacked_bar([("compute, copies", (1 - share) * 100, _e(_pct(1 - share))),
                                 ("communication overlapped with compute", share * overlap * 100,
                                  _e(_pct(share * overlap))),
                                 ("communication exposed", share * (1 - overlap) * 100, _e(_pct(share * (1 - overlap))))],
                                "Share of GPU busy time: compute, and communication overlapped or exposed", unit="%"))
    return "".join(out)


# -- ranks ------------------------------------------------------------------------------------------------

_RANK_SHOWN = ("step_ms", "compute_ms", "idle_ms", "idle_fraction")  # the columns every rank table has


def _rank_cell(v: Any, kind: str) -> str:
    if kind == "str" or not isinstance(v, (int, float)):
        return f"<td>{_e('' if v is None else v)}</td>"
    shown = _pct(v) if kind == "share" else _ms(v) if kind == "ms" else f"{v:.0f} MHz" if kind == "MHz" else f"{v:.1f}"
    return f'<td class="n">{_e(shown)}</td>'


def _ranks(report: Report) -> str:
    rows = report.ranks
    if not rows:
        return ""
    straggler = _fact(report, "ranks.straggler")
    top = max((r.get("step_ms") or 0) for r in rows)
    if top <= 0:
        return ""
    ticks = _ticks(top, 6)
    L, R, T, rh = 110, 20, 10, 24  # left and right margins, top, row height
    W, pw = CHART_W, CHART_W - L - R
    H = T + rh * len(rows) + 40
    out = []
    for j, r in enumerate(rows):
        yy = T + j * rh
        step = r.get("step_ms") or 0.0
        compute = r.get("compute_ms") or 0.0
        idle = r.get("idle_ms") or 0.0
        other = max(0.0, step - compute - idle)
        x0 = float(L)
        for i, (name, v) in enumerate((("GPU compute", compute), ("GPU idle", idle), ("rest of the step", other))):
            w = v / ticks[-1] * pw
            out.append(f'<rect class="seg" x="{x0:.2f}" y="{yy + 3}" width="{w:.2f}" height="{rh - 6}" '
                       f'fill="{_fill(i)}" stroke="#fff"><title>rank {_e(r.get("rank"))}: {name} {_e(_ms(v))}'
                       f'</title></rect>')
            x0 += w
        is_str = straggler is not None and r.get("rank") == straggler
        if is_str:
            out.append(f'<rect class="straggler" x="{L - 2}" y="{yy + 1}" width="{step / ticks[-1] * pw + 4:.2f}" '
                       f'height="{rh - 2}"/>')
        out.append(f'<text class="tick{" strong" if is_str else ""}" x="{L - 6}" y="{yy + rh / 2 + 4}" '
                   f'text-anchor="end">{"straggler ▸ " if is_str else ""}rank {_e(r.get("rank"))}</text>')
    for t in ticks:
        tx = L + t / ticks[-1] * pw
        out.append(f'<line class="grid" x1="{tx:.1f}" x2="{tx:.1f}" y1="{T}" y2="{T + rh * len(rows)}"/>'
                   f'<text class="tick" x="{tx:.1f}" y="{T + rh * len(rows) + 14}" text-anchor="middle">{_num(t)}</text>')
    out.append(f'<text class="label" x="{L + pw / 2}" y="{H - 6}" text-anchor="middle">median step time per rank (ms)'
               f'</text>')
    legend = "".join(f"<li>{_swatch(i)}{n}</li>" for i, n in enumerate(("GPU compute", "GPU idle",
                                                                         "rest of the step (communication, copies, CPU)")))
    # step, compute, idle and idle share always; the other columns where some rank has a value
    extra = [c for c in RANK_COLUMNS if c[0] not in _RANK_SHOWN and any(r.get(c[0]) is not None for r in rows)]
    table = ['<table><thead><tr><th>rank</th><th>file</th><th class="n">step</th><th class="n">GPU compute</th>'
             '<th class="n">GPU idle</th><th class="n">idle share</th>'
             + "".join(("<th>" if kind == "str" else '<th class="n">') + f"{_e(label)}</th>" for _, label, kind in extra)
             + '</tr></thead><tbody>']
    for j, r in enumerate(rows):
        table.append(f'<tr{" class=strong" if r.get("rank") == straggler else ""}><td>{_e(r.get("rank"))}</td>'
                     f'<td><code>{_e(r.get("file", ""))}</code></td>'
                     f'<td class="n">{_data(f"ranks.{j}.step_ms", r.get("step_ms"), _ms(r.get("step_ms")))}</td>'
                     f'<td class="n">{_e(_ms(r.get("compute_ms")))}</td><td class="n">{_e(_ms(r.get("idle_ms")))}</td>'
                     f'<td class="n">{_e(_pct(r.get("idle_fraction")))}</td>'
                     + "".join(_rank_cell(r.get(key), kind) for key, _, kind in extra) + '</tr>')
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
            + _svg(W, H, "Median step time per rank, split into GPU compute, GPU idle and the rest", "".join(out))
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
        return _e(_ms(v))
    if unit == "ratio":
        return _e(_pct(v))
    if unit == "bytes":
        return _e(f"{v / 2**20:.1f} MiB")
    return _e(f"{v:.4g}" if isinstance(v, float) else v) + (f" {_e(unit)}" if unit and unit != "count" else "")


def _finding(i: int, f: Finding, rule: RuleDoc | None, step_ms: Any) -> str:
    if f.ms_per_step is not None:
        cost = (f'<span class="saving">saves ~{_data(f"findings.{i - 1}.estimated_saving.ms_per_step", round(f.ms_per_step, 3), _ms(f.ms_per_step))}'
                f'/step' + (f" ({_pct(f.fraction_of_step)} of the step)" if f.fraction_of_step is not None else "")
                + "</span>")
        bar = ""
        if isinstance(step_ms, (int, float)) and step_ms > 0:
            w = min(1.0, round(f.ms_per_step, 3) / step_ms) * 300  # as report.json holds it
            bar = (f'<svg class="chart savebar" role="img" aria-label="saving as a share of the median step" '
                   f'viewBox="0 0 300 10" width="300" height="10"><rect width="300" height="10" fill="#e6e6e6"/>'
                   f'<rect width="{w:.1f}" height="10" fill="{_fill(0)}"/></svg>')
        cost += bar
    else:
        cost = '<span class="unmeasured">cost not measured here</span>'
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
    step = (report.summary.get("step_time_ms") or {}).get("median")
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
        saving = f"{_ms(f.ms_per_step)}/step" if f.ms_per_step is not None else '<span class="dim">not measured here</span>'
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
    links = [("summary", "at a glance", bool(report.findings)), ("steps", "step time", bool(report.summary.get("step_series"))),
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
        lines = "".join(f'<li><code>{_e(l.get("line"))}: {_e(l.get("code", ""))}</code> '
                        f'<span class="dim">({_e(_pct(l.get("share", 0)))})</span></li>' for l in h.lines[:3])
        ms = _data(f"hotspots.{k}.ms_per_step", round(h.ms_per_step, 3), f"{h.ms_per_step:.2f}")
        rows.append(f"<tr><td><code>{_e(h.function)}</code></td><td><code>{_e(_short(h.file))}:{h.line}</code></td>"
                    f'<td class="n">{ms} <svg class="chart inline" role="img" aria-label="ms per step" '
                    f'viewBox="0 0 120 10" width="120" height="10"><rect width="{w:.1f}" height="10" '
                    f'fill="{_fill(0)}"/></svg></td><td><ul class="lines">{lines}</ul></td></tr>')
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

def _distributions(sides: tuple[list[RunRecord], list[RunRecord]]) -> str:
    """Each run's steady-state step times as a strip of dots, baseline runs above current ones, on one
    axis; the gate's statistic (a low quantile) and the median of each run marked."""
    base, cur = sides
    rows = [("baseline", j, r) for j, r in enumerate(base, 1)] + [("current", j, r) for j, r in enumerate(cur, 1)]
    values = [v for _, _, r in rows for v in r.step_ms]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = hi - lo or max(hi, 1.0) * 0.1
    raw = span / 6
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    t0 = math.floor(lo / step) * step
    ticks = [t0 + i * step for i in range(int(math.ceil((hi - t0) / step - 1e-9)) + 1)]
    a, b = ticks[0], ticks[-1]
    L, R, T, rh = 130, 20, 10, 30  # left and right margins, top, row height
    W, pw = CHART_W, CHART_W - L - R
    H = T + rh * len(rows) + 42

    def x(v: float) -> float:
        return L + (v - a) / (b - a) * pw

    out = []
    for t in ticks:
        out.append(f'<line class="grid" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{T}" y2="{T + rh * len(rows)}"/>'
                   f'<text class="tick" x="{x(t):.1f}" y="{T + rh * len(rows) + 14}" text-anchor="middle">{_num(round(t, 6))}</text>')
    for k, (side, j, r) in enumerate(rows):
        yc = T + k * rh + rh / 2
        if side == "current" and k and rows[k - 1][0] == "baseline":
            out.append(f'<line class="axis" x1="{L - 120}" x2="{L + pw}" y1="{yc - rh / 2:.1f}" y2="{yc - rh / 2:.1f}"/>')
        out.append(f'<text class="tick" x="{L - 8}" y="{yc + 4:.1f}" text-anchor="end">{side} run {j}</text>')
        for i, v in enumerate(r.step_ms):
            jy = yc + ((i * 7) % 11 - 5)  # a fixed jitter, so that equal steps do not hide each other
            if side == "baseline":
                out.append(f'<circle class="dist base" cx="{x(v):.1f}" cy="{jy:.1f}" r="2.6"/>')
            else:
                out.append(f'<rect class="dist cur" x="{x(v) - 2.4:.1f}" y="{jy - 2.4:.1f}" width="4.8" height="4.8"/>')
        if r.median_ms:
            out.append(f'<line class="median" x1="{x(r.median_ms):.1f}" x2="{x(r.median_ms):.1f}" y1="{yc - 11:.1f}" '
                       f'y2="{yc + 11:.1f}"><title>median {_e(_ms(r.median_ms))}</title></line>')
        g = r.gate_ms
        if g and r.step_ms:
            out.append(f'<path class="gatemark" d="M{x(g) - 5:.1f},{yc - 14:.1f} L{x(g) + 5:.1f},{yc - 14:.1f} '
                       f'L{x(g):.1f},{yc - 7:.1f} Z"><title>gate statistic {_e(_ms(g))}</title></path>')
    out.append(f'<text class="label" x="{L + pw / 2}" y="{H - 6}" text-anchor="middle">steady-state step time (ms)</text>')
    legend = ('<ul class="legend"><li><svg class="swatch" width="14" height="14" aria-hidden="true"><circle cx="7" '
              'cy="7" r="3" class="dist base"/></svg>a baseline step</li><li><svg class="swatch" width="14" height="14" '
              'aria-hidden="true"><rect x="4" y="4" width="6" height="6" class="dist cur"/></svg>a current step</li>'
              '<li><svg class="swatch" width="14" height="14" aria-hidden="true"><line x1="7" x2="7" y1="0" y2="14" '
              'class="median"/></svg>the run\'s median</li><li><svg class="swatch" width="14" height="14" '
              'aria-hidden="true"><path class="gatemark" d="M2,3 L12,3 L7,10 Z"/></svg>the value the gate compares '
              '(a low quantile of the run\'s steps)</li></ul>')
    return _svg(W, H, "Steady-state step times of each baseline and current run, in ms", "".join(out)) + legend


def _interval(row: Any, t: float, level: float) -> str:
    """The step time's change and its interval against the gate's thresholds."""
    if row.change_pct is None:
        return ""
    up, down = t * 100, (1 / (1 + t) - 1) * 100
    lo_ci, hi_ci = row.ci_pct if row.ci_pct else (row.change_pct, row.change_pct)
    lim = max(abs(down), up, abs(lo_ci), abs(hi_ci)) * 1.25
    L, R, W, H = 40, 40, CHART_W, 96
    pw = W - L - R

    def x(v: float) -> float:
        return L + (v + lim) / (2 * lim) * pw

    ticks = _ticks(lim, 4)
    out = [f'<rect x="{x(down):.1f}" y="14" width="{x(up) - x(down):.1f}" height="44" fill="url(#hatch)">'
           f'<title>within the threshold</title></rect>',
           f'<text class="band" x="{x(0):.1f}" y="11" text-anchor="middle">within the threshold</text>',
           f'<line class="threshold" x1="{x(up):.1f}" x2="{x(up):.1f}" y1="14" y2="58"/>'
           f'<text class="tick" x="{x(up) + 3:.1f}" y="24">+{up:.0f}% fails</text>',
           f'<line class="threshold" x1="{x(down):.1f}" x2="{x(down):.1f}" y1="14" y2="58"/>']
    for tv in sorted({-v for v in ticks} | set(ticks)):
        out.append(f'<line class="axis" x1="{x(tv):.1f}" x2="{x(tv):.1f}" y1="58" y2="62"/>'
                   f'<text class="tick" x="{x(tv):.1f}" y="74" text-anchor="middle">{tv:+g}%</text>'.replace(">+0%<", ">0%<"))
    out.append(f'<line class="axis" x1="{L}" x2="{L + pw}" y1="58" y2="58"/>')
    if row.ci_pct:
        out.append(f'<line class="ci" x1="{x(lo_ci):.1f}" x2="{x(hi_ci):.1f}" y1="36" y2="36"/>'
                   f'<line class="ci" x1="{x(lo_ci):.1f}" x2="{x(lo_ci):.1f}" y1="29" y2="43"/>'
                   f'<line class="ci" x1="{x(hi_ci):.1f}" x2="{x(hi_ci):.1f}" y1="29" y2="43"/>')
    out.append(f'<circle class="point" cx="{x(row.change_pct):.1f}" cy="36" r="5"><title>{row.change_pct:+.1f}%</title>'
               f'</circle><text class="label" x="{L + pw / 2}" y="92" text-anchor="middle">change of the current '
               f'{_e(row.metric)} against the baseline (%)</text>')
    label = (f"Step time change {row.change_pct:+.1f}%"
             + (f", {level:.0%} interval {lo_ci:+.1f}% to {hi_ci:+.1f}%" if row.ci_pct else "") + f": {row.verdict}")
    return _svg(W, H, label, "".join(out))


def _gate(c: Comparison) -> str:
    d = c.as_dict()
    verdict = d["verdict"]
    out = [f'<section id="gate"><h2>Gate: <span class="verdict {VERDICT_CLASS.get(verdict, "")}">'
           f'{_e(verdict.upper())}</span></h2>',
           f'<p>Threshold {_data("gate.max_regression", c.max_regression, f"{c.max_regression:.0%}")}; '
           f'{d["baseline_runs"]} baseline run(s) against {d["current_runs"]} current run(s).</p>']
    timing = next((r for r in c.rows if r.kind == "timing"), None)
    if timing is not None:
        if timing.change_pct is not None:
            ci = (f", {d['ci_level']:.0%} interval {timing.ci_pct[0]:+.1f}%..{timing.ci_pct[1]:+.1f}%"
                  if timing.ci_pct else ", no interval")
            out.append(f'<p>{_e(timing.metric)}: {_e(_ms(timing.baseline))} → {_e(_ms(timing.current))}, '
                       f'{_data("gate.rows.0.change_pct", round(timing.change_pct, 2), f"{timing.change_pct:+.1f}%")}'
                       f'{ci}: <span class="verdict {VERDICT_CLASS.get(timing.verdict, "")}">{_e(timing.verdict)}'
                       f'</span></p>')
        out.append(_interval(timing, c.max_regression, d["ci_level"]))
    if c.sides[0] and c.sides[1]:
        out += ["<h3>Step-time distributions</h3>", _distributions(c.sides)]
    rows = []
    for r in c.rows:
        ci = f"{r.ci_pct[0]:+.1f}%..{r.ci_pct[1]:+.1f}%" if r.ci_pct else ""
        rows.append(f"<tr><td>{_e(r.metric)}</td><td class=\"n\">{_e(_gate_num(r.baseline, r.unit))}</td>"
                    f"<td class=\"n\">{_e(_gate_num(r.current, r.unit))}</td>"
                    f"<td class=\"n\">{'' if r.change_pct is None else f'{r.change_pct:+.1f}%'}</td>"
                    f"<td class=\"n\">{_e(ci)}</td><td><span class=\"verdict {VERDICT_CLASS.get(r.verdict, '')}\">"
                    f"{_e(r.verdict)}</span></td></tr>")
    out.append(f'<table><thead><tr><th>metric</th><th class="n">baseline</th><th class="n">current</th>'
               f'<th class="n">change</th><th class="n">{d["ci_level"]:.0%} interval</th><th>verdict</th></tr></thead>'
               f'<tbody>{"".join(rows)}</tbody></table>')
    for title, items, cls in (("New findings that fail the gate", c.failing_findings, "bad"),
                              ("New findings", [f for f in c.new_findings if f not in c.failing_findings], "warn"),
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


def _gate_num(v: Any, unit: str) -> str:
    if not isinstance(v, (int, float)):
        return "n/a"
    if unit == "bytes":
        return f"{v / 2**20:.1f} MiB"
    return f"{v:.4g} {unit}".strip()


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
    target = run.get("script") or run.get("module") or run.get("trace") or ""
    rows = [("analysed", f"<code>{_e(_short(str(target)))}</code>")]
    if run.get("label"):
        rows.append(("ranks", _e(run["label"])))
    if run.get("device"):
        rows.append(("device", _e(run["device"])))
    if run.get("torch"):
        rows.append(("torch", _e(run["torch"])))
    if s.get("steps_observed") is not None:
        clock = run.get("step_clock") or s.get("step_clock") or ""
        rows.append(("steps", f'{_data("summary.steps_observed", s["steps_observed"], str(s["steps_observed"]))} seen, '
                              f'{_e(s.get("steps_profiled") or 0)} profiled'
                     + (f" (counted by {_e(clock)})" if clock else "")))
    st = s.get("step_time_ms") or {}
    if st.get("median") is not None:
        rows.append(("step time", f'median {_data("summary.step_time_ms.median", st["median"], _ms(st["median"]))}, '
                                  f'p90 {_data("summary.step_time_ms.p90", st.get("p90"), _ms(st.get("p90")))}'
                     + (f" over {_e(st.get('n'))} steady-state steps" if st.get("n") else "")))
    exit_info = run.get("exit") or {}
    if exit_info.get("reason") and exit_info.get("reason") not in ("completed", "steps-reached"):
        rows.append(("script", f'<span class="bad">{_e(exit_info["reason"])} (exit code {_e(exit_info.get("code"))})'
                               f"</span>"))
    if run.get("run_dir"):
        rows.append(("run folder", f"<code>{_e(_short(run['run_dir']))}</code>"))
    files = [run["trace_file"]] if run.get("trace_file") else list(run.get("files") or [])
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    return f'<header><h1>perfdoctor report</h1><dl class="run">{dl}</dl>{_perfetto(files)}</header>'


def _memory_chart(mem: dict[str, Any]) -> str:
    """Memory at each step's end (MiB), the steady steps' fitted growth as a dashed line, and the peak's
    parts as one bar."""
    pts = [(i + 1, v / 2**20) for i, v in enumerate(mem.get("bytes") or []) if v is not None]
    if len(pts) < 2:
        return ""
    W, H, L, B, T = CHART_W, 200, 64, 30, 10
    hi = _ticks(max(v for _, v in pts))[-1] or 1.0
    n = max(i for i, _ in pts)

    def x(i: float) -> float:
        return L + (W - L - 12) * (i - 1) / max(1, n - 1)

    def y(v: float) -> float:
        return T + (H - T - B) * (1 - v / hi)

    out = [f'<line class="axis" x1="{L}" x2="{W - 12}" y1="{y(0):.1f}" y2="{y(0):.1f}"/>']
    for t in _ticks(hi, 4):
        out.append(f'<text class="tick" x="{L - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{_num(t)}</text>')
    out.append('<polyline class="mem" fill="none" stroke="#aa3377" stroke-width="1.5" points="'
               + " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in pts) + '"/>')
    g = mem.get("growth_bytes_per_step")
    if g is not None:
        last_i, last_v = pts[-1]
        first_i = pts[0][0]
        out.append(f'<line class="fit" x1="{x(first_i):.1f}" y1="{y(last_v - g / 2**20 * (last_i - first_i)):.1f}" '
                   f'x2="{x(last_i):.1f}" y2="{y(last_v):.1f}" stroke="#333" stroke-dasharray="4 3"/>')
    out.append(f'<text class="label" x="{W - 12}" y="{H - 4}" text-anchor="end">step (MiB at its end)</text>')
    chart = _svg(W, H, f"memory at each step's end ({mem.get('source', '')}), in MiB", "".join(out))
    parts = mem.get("parts") or {}
    peak = mem.get("peak_bytes")
    bar = ""
    if parts and isinstance(peak, (int, float)):
        rows = [(k.replace("_", " "), v / 2**20, f"{v / 2**20:,.1f} MiB") for k, v in parts.items()]
        other = peak / 2**20 - sum(r[1] for r in rows)
        if other > 0:
            rows.append(("other", other, f"{other:,.1f} MiB"))
        bar = "<h3>The peak, by what holds it</h3>" + _stacked_bar(rows, "the peak memory by what holds it, in MiB",
                                                                     unit="ms", key="memory")
    return chart + f'<p class="dim">{_e(memory_line(mem))}</p>' + bar.replace("ms per step", "MiB")


def _step_section(report: Report) -> str:
    s = report.summary
    parts = []
    chart = _step_chart(s)
    if chart:
        parts.append('<section id="steps"><h2>Step time over the run</h2>' + chart + "</section>")
    mem = _memory_chart(s.get("memory") or {})
    if mem:
        parts.append('<section id="memory"><h2>Memory over the run</h2>' + mem + "</section>")
    bd = []
    if s.get("breakdown"):
        gpu_trace = report.run.get("kind") == "trace" and _fact(report, "step.gpu_kernel_ms") is not None
        bd.append(_breakdown(s["breakdown"], "breakdown",
                             "Where the median step goes, in ms" + (" (GPU timeline)" if gpu_trace else "")))
    if s.get("gpu_breakdown"):
        bd += ["<h3>GPU timeline per step</h3>",
               _breakdown(s["gpu_breakdown"], "gpu_breakdown", "Where the median step goes on the GPU, in ms")]
    bd.append(_gpu_summary(report))
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


CSS = """
:root{--ink:#1b1f24;--dim:#5b6470;--line:#d0d7de;--bg:#ffffff;--soft:#f6f8fa;--bad:#b42318;--good:#1a7f37;--warn:#9a6700}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:1500px;margin:0 auto;padding:24px 20px 48px}
nav.toc{position:sticky;top:0;z-index:1;background:var(--bg);border-bottom:1px solid var(--line);padding:6px 0;margin:8px 0 0}
table.glance td:nth-child(2){min-width:18em}
@media (min-width:1200px){#findings .cards{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:0 18px;align-items:start}}
h1{font-size:1.6em;margin:0 0 8px}h2{font-size:1.25em;margin:32px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px}
h3{font-size:1.05em;margin:18px 0 6px}h4{margin:12px 0 4px;font-size:.95em}
code,pre{font:13px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:var(--soft);padding:8px 10px;border-radius:6px;overflow-x:auto;white-space:pre-wrap;word-break:break-word}
dl.run{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:0}dl.run dt{font-weight:600}dl.run dd{margin:0;word-break:break-all}
.dim,.note{color:var(--dim)}.note{font-size:.92em}
.bad{color:var(--bad);font-weight:600}.good{color:var(--good)}.warn{color:var(--warn)}
svg.chart{display:block;max-width:100%;height:auto;margin:6px 0}svg.savebar{display:inline-block;vertical-align:middle;margin:0 0 0 8px}
svg.inline{margin:4px 0 0 auto}
svg.defs{position:absolute}
.grid{stroke:#e3e7ec;stroke-width:1}.axis{stroke:#57606a;stroke-width:1}
.tick{font-size:11px;fill:#424a53}.tick.strong{font-weight:700;fill:var(--ink)}.label{font-size:12px;fill:var(--ink)}
.band{font-size:11px;fill:#57606a;font-style:italic}
.series{fill:none;stroke:#8c99a8;stroke-width:1}.band-series{fill:#9db4d0;stroke:#1d4e89;stroke-width:.6}
.pt{fill:#1d4e89;stroke:#1d4e89;stroke-width:1}.pt.out{fill:#ffffff;stroke:#5b6470;stroke-width:1.3}
.off{fill:#b42318}.offlabel{font-size:10px;fill:#b42318}
.median{stroke:#111;stroke-width:1.6}.p90{stroke:#111;stroke-width:1.3;stroke-dasharray:6 4}
.statlabel{font-size:11.5px;fill:var(--ink)}
.straggler{fill:none;stroke:#b42318;stroke-width:2.5}
.dist.base{fill:#1d4e89;fill-opacity:.75}.dist.cur{fill:#f6b26b;stroke:#6b3d00;stroke-width:.8}
.gatemark{fill:#111}.threshold{stroke:#b42318;stroke-width:1.5;stroke-dasharray:4 3}
.ci{stroke:#111;stroke-width:2}.point{fill:#111}
ul.legend{list-style:none;padding:0;margin:4px 0 10px;display:flex;flex-wrap:wrap;gap:4px 18px;font-size:.9em}
ul.legend li{display:flex;align-items:center;gap:6px}svg.swatch{flex:none}
table{border-collapse:collapse;width:100%;margin:6px 0 10px;font-size:.92em}
th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}
th.n,td.n{text-align:right;white-space:nowrap}tr.strong td{font-weight:700}
ul.lines{list-style:none;margin:0;padding:0}ul.lines code{white-space:pre-wrap;word-break:break-word}
.finding{border:1px solid var(--line);border-left-width:6px;border-radius:6px;padding:6px 14px 10px;margin:14px 0}
.finding h3{margin:6px 0 2px}.finding .num{color:var(--dim)}
.sev-high{border-left-color:#b42318}.sev-medium{border-left-color:#d4a72c}.sev-low{border-left-color:#8c99a8}
.sev{font-size:.75em;letter-spacing:.05em;border:1px solid currentColor;border-radius:4px;padding:0 5px;margin-left:6px}
.sev-high .sev{color:var(--bad)}.sev-medium .sev{color:var(--warn)}.sev-low .sev{color:var(--dim)}
.saving{color:var(--good);font-weight:600}.unmeasured{color:var(--dim)}
ul.locations{list-style:none;padding:0;margin:4px 0}ul.locations li{word-break:break-word}
code.where{color:#0b5cad}code.code{color:#424a53}
pre.diff .del{color:#82071e;background:#ffebe9;display:block}pre.diff .add{color:#116329;background:#dafbe1;display:block}
details{margin:6px 0}summary{cursor:pointer;color:#0b5cad}
.verdict{font-weight:700}
.notes{margin-top:24px}footer{margin-top:40px;color:var(--dim);font-size:.85em}
@media print{summary{color:var(--ink)}details{display:block}}
"""

# expand or collapse every rule explanation at once; the page reads fine without it
JS = """(function(){var b=document.getElementById('toggle-explain');if(!b)return;b.hidden=false;
b.addEventListener('click',function(){var open=b.getAttribute('aria-pressed')!=='true';
document.querySelectorAll('details.explain').forEach(function(d){d.open=open;});
b.setAttribute('aria-pressed',open?'true':'false');
b.textContent=open?'Collapse every explanation':'Expand every explanation';});})();"""

# nothing on the page may reach the network: no fetches, images or fonts from anywhere
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


def _page(title: str, body: list[str]) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>{_defs()}<main>{''.join(body)}"
            f'<footer>perfdoctor {_e(__version__)}: a self-contained page; the charts are SVG drawn from '
            f"report.json's numbers.</footer></main><script>{JS}</script></body></html>\n")


def render_report(report: Report, comparison: Comparison | None = None) -> str:
    """The report as one HTML page; with the gate's `comparison`, the verdict and the two sides' step
    times follow the report. The explanations are the report's own (`Report.rules`)."""
    target = report.run.get("script") or report.run.get("module") or report.run.get("trace") or ""
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
