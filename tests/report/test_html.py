"""The HTML report (perfdoctor/report/html.py) and the text report's sparkline: what the page holds,
that its numbers are report.json's, that nothing from input reaches it as HTML, and its size.
tests/report/test_html_browser.py opens the pages in a real browser."""

from __future__ import annotations

import dataclasses
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import msgspec
import pytest

from perfdoctor.analysis import analyse_path
from perfdoctor.contracts.report import HotLineDoc, RankRowDoc, StepSeriesDoc
from perfdoctor.facts.model import Location
from perfdoctor.model import Hotspot
from perfdoctor.report import html
from perfdoctor.report.common import chart_top
from perfdoctor.report.text import sparkline
from tests.helpers import REPO, run_cli

sys.path.insert(0, str(REPO / "tests" / "golden"))
import record  # noqa: E402

TRACES = REPO / "tests" / "data" / "traces"
RANKS = TRACES / "param__dlrm_kineto_8ranks"
GPU_TRACE = TRACES / "kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
HOSTILE = '<img src=x onerror=alert(1)>'


class _Page(HTMLParser):
    """The tags of a page, its <data> values by key, and whether it loads anything from outside."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.data: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "data" and "data-key" in a:
            self.data[a["data-key"]] = a["value"]


def parse(page: str) -> _Page:
    p = _Page()
    p.feed(page)
    return p


@pytest.fixture(scope="module")
def run_report():
    return analyse_path(record.materialise("pd002_dataloader_workers"))


def test_run_page_shows_every_part(run_report) -> None:
    page = html.render_report(run_report)
    p = parse(page)
    ids = {a.get("id") for _, a in p.tags}
    assert {"steps", "breakdown", "findings", "hotspots", "finding-1"} <= ids
    assert "ranks" not in ids and "gate" not in ids
    charts = [a for t, a in p.tags if t == "svg" and "chart" in (a.get("class") or "")]
    assert len(charts) >= 3 and all(a.get("aria-label") for a in charts)
    assert "step time (ms)" in page and ">step</text>" in page  # axis labels and units
    assert "profiled window" in page and "warm-up" in page and "median 56.8 ms" in page and "p90 58.6 ms" in page
    # the fix as a diff, the rule's explanation one click away, Perfetto with the file to load
    assert '<span class="del">- loader = DataLoader(' in page and '<span class="add">+ loader = DataLoader(' in page
    assert '<details class="explain">' in page and "perfdoctor explain PD002" in page and "Why is this bad?" in page
    assert 'href="https://ui.perfetto.dev"' in page and "trace.json.gz" in page
    # self-contained: no script, style, image or font from anywhere; a CSP forbids fetching any
    for tag, a in p.tags:
        assert not (tag in ("script", "img", "iframe") and a.get("src")), (tag, a)
        assert not (tag == "link" and a.get("rel") == "stylesheet"), a
    assert "default-src 'none'" in page
    assert len(page.encode()) < 2 * 2**20


def test_page_numbers_are_report_json_numbers(run_report) -> None:
    d = run_report.as_dict()
    got = parse(html.render_report(run_report)).data
    st = d["summary"]["step_time_ms"]
    assert float(got["summary.step_time_ms.median"]) == st["median"]
    assert float(got["summary.step_time_ms.p90"]) == st["p90"]
    assert int(got["summary.steps_observed"]) == d["summary"]["steps_observed"]
    for i, b in enumerate(d["summary"]["breakdown"]):
        if b["ms"] > 0:
            assert float(got[f"summary.breakdown.{i}.ms"]) == b["ms"]
    assert float(got["findings.0.estimated_saving.ms_per_step"]) == d["findings"][0]["estimated_saving"]["ms_per_step"]
    assert float(got["hotspots.0.ms_per_step"]) == d["hotspots"][0]["ms_per_step"]


def test_step_chart_draws_every_step_and_marks_the_off_scale_first_step(run_report) -> None:
    page = html.render_report(run_report)
    ms = run_report.summary.step_series.ms
    assert ms[0] > chart_top(ms)  # the first step (2.3 s of warm-up) is off the scale
    assert page.count('<circle class="pt"') == 11  # steady-state steps 15..25
    assert page.count('<circle class="pt out"') == len(ms) - 11 - 1  # the others but the off-scale one
    assert page.count('<path class="off"') == 2 and "step 1: 2339 ms" in page  # the step, and in the legend


def test_gpu_trace_page_shows_the_gpu_timeline() -> None:
    r = analyse_path(GPU_TRACE)
    page = html.render_report(r)
    got = parse(page).data
    assert "GPU timeline per step" in page and "waiting for the host to launch work" in page
    assert float(got["facts.gpu.idle_host_wait_ms"]) == r.facts["gpu.idle_host_wait_ms"].value
    assert float(got["facts.gpu.utilization"]) == r.facts["gpu.utilization"].value

    # a trace has no source to rewrite: its fixes are words alone, shown as the fix (not "for
    # example") and without an empty diff
    words = [f for f in r.findings if f.fix and not (f.fix.before or f.fix.after)]
    assert words and not any(f.fix.example for f in words)
    assert '<pre class="diff"></pre>' not in page and "Fix, for example:" not in page


def test_rank_folder_page_marks_the_straggler() -> None:
    r = analyse_path(RANKS)
    page = html.render_report(r)
    got = parse(page).data
    straggler = r.facts["ranks.straggler"].value
    assert f"straggler ▸ rank {straggler}<" in page and page.count('class="straggler"') == 1
    assert [float(got[f"ranks.{j}.step_ms"]) for j in range(len(r.ranks))] == [x.step_ms for x in r.ranks]
    # communication exposed versus overlapped
    assert "communication exposed" in page and float(got["facts.comm.overlap"]) == r.facts["comm.overlap"].value


def test_rank_folder_page_without_a_straggler_says_why() -> None:
    # the same ranks, where the test found the gaps within the noise of their steps: no rank marked
    r = analyse_path(RANKS)
    facts = {k: v for k, v in r.facts.items() if not k.startswith("ranks.straggler")}
    facts["ranks.imbalance_p"] = dataclasses.replace(r.facts["ranks.imbalance_ratio"], name="ranks.imbalance_p",
                                                     value=0.4)
    page = html.render_report(dataclasses.replace(r, facts=facts, findings=[f for f in r.findings if f.rule != "PD012"]))
    assert 'class="straggler"' not in page and "is the straggler" not in page
    assert "No rank is a straggler: the gaps between them are within the noise of their steps" in page
    assert float(parse(page).data["facts.ranks.imbalance_p"]) == 0.4


def test_no_input_string_reaches_the_page_as_html(run_report) -> None:
    r = dataclasses.replace(run_report)
    r.run = msgspec.structs.replace(r.run, device=HOSTILE, script=f"/tmp/{HOSTILE}/train.py", run_dir=f"/tmp/{HOSTILE}",
                                    trace_file=f"/tmp/{HOSTILE}/trace.json.gz")
    f = dataclasses.replace(r.findings[0], title=HOSTILE, message=HOSTILE, why=HOSTILE, saving_basis=HOSTILE,
                            locations=[Location(f"/x/{HOSTILE}.py", 3, HOSTILE, HOSTILE)],
                            fix=dataclasses.replace(r.findings[0].fix, before=HOSTILE, after=HOSTILE, note=HOSTILE),
                            references=[f"javascript:alert(1)//{HOSTILE}"])
    r.findings = [f]
    r.hotspots = [Hotspot(HOSTILE, f"/x/{HOSTILE}.py", 1, 1.0, 1.0, [HotLineDoc(line=1, code=HOSTILE, share=1.0)])]
    r.notes = [HOSTILE]
    r.ranks = [RankRowDoc(rank=HOSTILE, file=HOSTILE, step_ms=2.0, compute_ms=1.0, idle_ms=0.5,
                          idle_fraction=0.25)]
    r.rules = []
    page = html.render_report(r)  # no rule documentation in the report: the finding's own `why` and references are shown
    assert "<img" not in page and "javascript:" not in page.replace("javascript:alert(1)//&lt;img", "")
    assert 'href="javascript' not in page
    assert page.count("&lt;img src=x onerror=alert(1)&gt;") >= 10


def test_comparison_page_shows_the_verdict_its_interval_and_both_sides() -> None:
    from perfdoctor.gate.compare import compare, load_side

    base = load_side(record.materialise("pd002_dataloader_workers"))
    cur = load_side(record.materialise("pd002_dataloader_workers_fixed"))
    c = compare(base, cur, 0.10)
    page = html.render_comparison(c)
    d = c.as_dict()
    got = parse(page).data
    assert f">{d['verdict'].upper()}<" in page
    assert float(got["gate.rows.0.change_pct"]) == d["rows"][0]["change_pct"]
    lo, hi = d["rows"][0]["ci_pct"]
    assert f"{lo:+.1f}%..{hi:+.1f}%" in page and "+10% fails" in page
    assert "baseline run 1" in page and "current run 1" in page
    assert page.count('<circle class="dist base"') == len(base[0].step_ms)
    assert page.count('<rect class="dist cur"') == len(cur[0].step_ms)


def test_comparison_page_lists_new_and_resolved_findings() -> None:
    from perfdoctor.contracts.baseline import GateFinding
    from perfdoctor.gate.compare import compare, load_side

    side = load_side(record.materialise("pd002_dataloader_workers"))
    new = GateFinding(rule="PD002", fingerprint="a", title="DataLoader loads in the main process")
    gone = GateFinding(rule="PD006", fingerprint="b", title=HOSTILE)
    c = dataclasses.replace(compare(side, side, 0.10), new_findings=[new], resolved_findings=[gone])
    page = html.render_comparison(c)
    assert "<li>PD002 DataLoader loads in the main process</li>" in page
    assert "<li>PD006 &lt;img src=x onerror=alert(1)&gt;</li>" in page


def test_a_long_run_stays_small(run_report) -> None:
    r = dataclasses.replace(run_report)
    ms = [50.0 + (i % 100 == 0) * 40 for i in range(50_000)]  # a stall every 100 steps
    r.summary = msgspec.structs.replace(r.summary, step_series=StepSeriesDoc(ms=ms, steady=[[100, 50_000]], window=[6, 13]))
    page = html.render_report(r)
    assert len(page.encode()) < 2 * 2**20
    assert '<polygon class="band-series"' in page


def test_sparkline_shows_stalls_and_clips_the_first_step() -> None:
    ms = [2000.0] + [50.0] * 9 + [100.0] + [50.0] * 9
    line = sparkline(ms)
    assert len(line) == len(ms) and line[0] == "█"
    assert line[10] > line[9] and len(set(line[1:10])) == 1
    assert len(sparkline([50.0] * 10_000)) <= 60
    assert sparkline([]) == ""


def test_cli_writes_html_for_report_and_compare(tmp_path: Path) -> None:
    run = record.materialise("pd002_dataloader_workers")
    out = tmp_path / "r.html"
    p = run_cli("report", str(run), "--format", "html", "--output", str(out))
    assert p.returncode == 0, p.stderr
    assert out.read_text().startswith("<!DOCTYPE html>")
    cmp_out = tmp_path / "c.html"
    fixed = record.materialise("pd002_dataloader_workers_fixed")
    p = run_cli("compare", str(run), str(fixed), "--format", "html", "--output", str(cmp_out))
    assert p.returncode == 0, p.stderr
    assert 'id="gate"' in cmp_out.read_text()
    assert re.search(r"<svg class=\"chart\"", cmp_out.read_text())
