"""The HTML report's charts, drawn as inline SVG from the report's numbers (no script, no network):
the steps' times, a stacked bar of where a step goes, the memory over the steps, and the gate's two
sides (their step-time distributions, the interval of their ratio). Every string from input goes
through `escape.html_text`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from perfdoctor.contracts.report import MemoryDoc, StepSeriesDoc, StepTimeDoc, SummaryDoc
from perfdoctor.report import escape
from perfdoctor.report.common import chart_top
from perfdoctor.report.memory import memory_line
from perfdoctor.stats import ms_text

if TYPE_CHECKING:
    from perfdoctor.gate.baseline import RunRecord


CHART_W = 760


# Fills for the parts of a bar: lightness alternates from one to the next and every other fill
# carries a pattern, so neighbours stay apart in grey and for colour-blind readers.
FILLS = [("#1d4e89", None), ("#f6b26b", None), ("#3a9e8f", "stripes"), ("#d9d9d9", "dots"),
         ("#6a3d9a", None), ("#a6cee3", "cross"), ("#8c510a", "stripes"), ("#fde68a", None),
         ("#555555", "dots")]


def defs() -> str:
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


def fill(i: int) -> str:
    color, pat = FILLS[i % len(FILLS)]
    return color if pat is None else f"url(#fill{i % len(FILLS)})"


def swatch(i: int) -> str:
    return (f'<svg class="swatch" width="14" height="14" aria-hidden="true"><rect width="14" height="14" '
            f'fill="{fill(i)}" stroke="#333" stroke-width="0.5"/></svg>')


def axis_ticks(hi: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least `hi` (steps of 1, 2 or 5 times a power of ten)."""
    if hi <= 0:
        return [0.0, 1.0]
    raw = hi / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    n = math.ceil(hi / step - 1e-9)
    return [i * step for i in range(n + 1)]


def num(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e6 else f"{v:.3g}"


def svg(w: int, h: int, label: str, body: str) -> str:
    return (f'<svg class="chart" role="img" aria-label="{escape.html_text(label)}" viewBox="0 0 {w} {h}" width="{w}" '
            f'height="{h}" xmlns="http://www.w3.org/2000/svg"><title>{escape.html_text(label)}</title>{body}</svg>')


def step_chart(summary: SummaryDoc) -> str:
    series = summary.step_series or StepSeriesDoc()
    ms: list[float] = series.ms
    if not ms:
        return ""
    n = len(ms)
    st = summary.step_time_ms or StepTimeDoc()
    top = chart_top(ms)
    ticks = axis_ticks(top)
    y_hi = ticks[-1]
    L, R, T, B = 64, 120, 24, 46
    W, H = CHART_W, 280
    pw, ph = W - L - R, H - T - B

    def x(i: float) -> float:  # step i (1-based) at the middle of its slot
        return L + (i - 0.5) / n * pw

    def y(v: float) -> float:
        return T + ph - min(v, y_hi) / y_hi * ph

    steady: set[int] = set()
    for lo, hi in series.steady:
        steady.update(range(lo, hi + 1))
    out = []
    window = series.window
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
                   f'<text class="tick" x="{L - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{num(t)}</text>')
    for t in axis_ticks(n, 8):
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
            tip = f"<title>step {i}: {ms_text(v)}{'' if i in steady else ' (left out of the statistics)'}</title>"
            if v > y_hi:
                out.append(f'<path class="off" d="M{x(i) - 4:.1f},{T + 7} L{x(i):.1f},{T} L{x(i) + 4:.1f},{T + 7} Z">'
                           f'{tip}</path><text class="offlabel" x="{x(i) + 6:.1f}" y="{T + 8}">{escape.html_text(ms_text(v))}</text>')
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
    for key, stat in (("median", st.median), ("p90", st.p90)):
        if isinstance(stat, (int, float)):
            out.append(f'<line class="{key}" x1="{L}" x2="{L + pw}" y1="{y(stat):.1f}" y2="{y(stat):.1f}"/>')
    med, p90 = st.median, st.p90
    if isinstance(med, (int, float)) and isinstance(p90, (int, float)):
        ym, yp = y(med), y(p90)
        if abs(ym - yp) < 13:  # keep the two labels apart
            yp, ym = min(yp, ym - 13), max(ym, yp + 13) if yp >= ym - 13 else ym
        out.append(f'<text class="statlabel" x="{L + pw + 6}" y="{ym + 4:.1f}">median {escape.html_text(ms_text(med))}</text>'
                   f'<text class="statlabel" x="{L + pw + 6}" y="{yp + 4:.1f}">p90 {escape.html_text(ms_text(p90))}</text>')
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
    return svg(W, H, label, "".join(out)) + legend


def stacked_bar(parts: list[tuple[str, float, str]], label: str, unit: str = "ms", key: str = "") -> str:
    """One horizontal bar of parts (name, value, shown text), with an axis in `unit` and a legend."""
    parts = [p for p in parts if p[1] > 0]
    total = sum(p[1] for p in parts)
    if total <= 0:
        return ""
    L, R, W = 10, 20, CHART_W
    pw = W - L - R
    H = 66
    ticks = axis_ticks(total, 6) if unit == "ms" else [0, 25, 50, 75, 100]
    scale_hi = ticks[-1] if unit == "ms" else 100.0
    out, x0 = [], float(L)
    for i, (name, v, shown) in enumerate(parts):
        w = v / scale_hi * pw
        out.append(f'<rect class="seg" x="{x0:.2f}" y="8" width="{w:.2f}" height="30" fill="{fill(i)}" '
                   f'stroke="#fff" stroke-width="1"><title>{escape.html_text(name)}: {escape.html_text(shown)}</title></rect>')
        x0 += w
    for t in ticks:
        tx = L + t / scale_hi * pw
        out.append(f'<line class="axis" x1="{tx:.1f}" x2="{tx:.1f}" y1="40" y2="44"/>'
                   f'<text class="tick" x="{tx:.1f}" y="56" text-anchor="middle">{num(t)}</text>')
    out.append(f'<line class="axis" x1="{L}" x2="{L + pw}" y1="40" y2="40"/>'
               f'<text class="label" x="{L + pw}" y="66" text-anchor="end">{"ms per step" if unit == "ms" else "%"}'
               f'</text>')
    legend = "".join(f'<li>{swatch(i)}{escape.html_text(name)} {shown_html}</li>'
                     for i, (name, _, shown_html) in enumerate((n, v, s) for n, v, s in parts))
    return svg(W, H + 4, label, "".join(out)) + f'<ul class="legend">{legend}</ul>'


def distributions(sides: tuple[list[RunRecord], list[RunRecord]]) -> str:
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
                   f'<text class="tick" x="{x(t):.1f}" y="{T + rh * len(rows) + 14}" text-anchor="middle">{num(round(t, 6))}</text>')
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
                       f'y2="{yc + 11:.1f}"><title>median {escape.html_text(ms_text(r.median_ms))}</title></line>')
        g = r.gate_ms
        if g and r.step_ms:
            out.append(f'<path class="gatemark" d="M{x(g) - 5:.1f},{yc - 14:.1f} L{x(g) + 5:.1f},{yc - 14:.1f} '
                       f'L{x(g):.1f},{yc - 7:.1f} Z"><title>gate statistic {escape.html_text(ms_text(g))}</title></path>')
    out.append(f'<text class="label" x="{L + pw / 2}" y="{H - 6}" text-anchor="middle">steady-state step time (ms)</text>')
    legend = ('<ul class="legend"><li><svg class="swatch" width="14" height="14" aria-hidden="true"><circle cx="7" '
              'cy="7" r="3" class="dist base"/></svg>a baseline step</li><li><svg class="swatch" width="14" height="14" '
              'aria-hidden="true"><rect x="4" y="4" width="6" height="6" class="dist cur"/></svg>a current step</li>'
              '<li><svg class="swatch" width="14" height="14" aria-hidden="true"><line x1="7" x2="7" y1="0" y2="14" '
              'class="median"/></svg>the run\'s median</li><li><svg class="swatch" width="14" height="14" '
              'aria-hidden="true"><path class="gatemark" d="M2,3 L12,3 L7,10 Z"/></svg>the value the gate compares '
              '(a low quantile of the run\'s steps)</li></ul>')
    return svg(W, H, "Steady-state step times of each baseline and current run, in ms", "".join(out)) + legend


def interval(row: Any, t: float, level: float) -> str:
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

    ticks = axis_ticks(lim, 4)
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
               f'{escape.html_text(row.metric)} against the baseline (%)</text>')
    label = (f"Step time change {row.change_pct:+.1f}%"
             + (f", {level:.0%} interval {lo_ci:+.1f}% to {hi_ci:+.1f}%" if row.ci_pct else "") + f": {row.verdict}")
    return svg(W, H, label, "".join(out))


def memory_chart(mem: MemoryDoc) -> str:
    """Memory at each step's end (MiB), the steady steps' fitted growth as a dashed line, and the peak's
    parts as one bar."""
    pts = [(i + 1, v / 2**20) for i, v in enumerate(mem.bytes) if v is not None]
    if len(pts) < 2:
        return ""
    W, H, L, B, T = CHART_W, 200, 64, 30, 10
    hi = axis_ticks(max(v for _, v in pts))[-1] or 1.0
    n = max(i for i, _ in pts)

    def x(i: float) -> float:
        return L + (W - L - 12) * (i - 1) / max(1, n - 1)

    def y(v: float) -> float:
        return T + (H - T - B) * (1 - v / hi)

    out = [f'<line class="axis" x1="{L}" x2="{W - 12}" y1="{y(0):.1f}" y2="{y(0):.1f}"/>']
    for t in axis_ticks(hi, 4):
        out.append(f'<text class="tick" x="{L - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{num(t)}</text>')
    out.append('<polyline class="mem" fill="none" stroke="#aa3377" stroke-width="1.5" points="'
               + " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in pts) + '"/>')
    g = mem.growth_bytes_per_step
    if g is not None:
        last_i, last_v = pts[-1]
        first_i = pts[0][0]
        out.append(f'<line class="fit" x1="{x(first_i):.1f}" y1="{y(last_v - g / 2**20 * (last_i - first_i)):.1f}" '
                   f'x2="{x(last_i):.1f}" y2="{y(last_v):.1f}" stroke="#333" stroke-dasharray="4 3"/>')
    out.append(f'<text class="label" x="{W - 12}" y="{H - 4}" text-anchor="end">step (MiB at its end)</text>')
    chart = svg(W, H, f"memory at each step's end ({mem.source}), in MiB", "".join(out))
    parts, peak = mem.parts, mem.peak_bytes
    bar = ""
    if parts and isinstance(peak, (int, float)):
        rows = [(k.replace("_", " "), v / 2**20, f"{v / 2**20:,.1f} MiB") for k, v in parts.items()]
        other = peak / 2**20 - sum(r[1] for r in rows)
        if other > 0:
            rows.append(("other", other, f"{other:,.1f} MiB"))
        bar = "<h3>The peak, by what holds it</h3>" + stacked_bar(rows, "the peak memory by what holds it, in MiB",
                                                                     unit="ms", key="memory")
    return chart + f'<p class="dim">{escape.html_text(memory_line(mem))}</p>' + bar.replace("ms per step", "MiB")
