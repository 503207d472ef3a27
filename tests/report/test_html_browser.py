"""The HTML report as a person sees it: each page opens in a real headless browser (Playwright driving
the system Chromium, /usr/bin/chromium from Debian), with no network; its charts are drawn (SVG with a
non-zero size), nothing logs an error, nothing from input runs as script, and the explain toggle works.

In CI (the CI environment variable set) a browser that cannot start fails the test: .ci/run installs
chromium. Elsewhere, without playwright or chromium, the test is skipped.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path

import msgspec
import pytest

from perfdoctor.analysis import analyse_path
from perfdoctor.report import html
from tests.helpers import REPO

sys.path.insert(0, str(REPO / "tests" / "golden"))
import record  # noqa: E402

pytestmark = pytest.mark.slow  # the browser: run by CI, not in the fast tier

CHROMIUM = os.environ.get("PERFDOCTOR_CHROMIUM", "/usr/bin/chromium")
HOSTILE = '<img src=x onerror=alert(1)>'


def _browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        return f"no chromium at {CHROMIUM} (apt-get install chromium)"
    return None


@pytest.fixture(scope="module")
def browser():
    missing = _browser_missing()
    if missing and not os.environ.get("CI"):
        pytest.skip(missing)
    assert missing is None, f"CI must run the browser test: {missing}"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _open(browser, page_html: str, tmp_path: Path):
    """The page from a file, offline; returns (page, console errors and page errors, dialogs, requests)."""
    f = tmp_path / "report.html"
    f.write_text(page_html, encoding="utf-8")
    ctx = browser.new_context(offline=True, viewport={"width": 900, "height": 1200})
    page = ctx.new_page()
    errors: list[str] = []
    dialogs: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
    page.goto(f.as_uri())
    page.wait_for_load_state("load")
    return page, errors, dialogs, requests


def _charts_drawn(page) -> list[dict]:
    boxes = page.eval_on_selector_all(
        "svg.chart", "els => els.map(e => { const r = e.getBoundingClientRect();"
                     " return {label: e.getAttribute('aria-label'), w: r.width, h: r.height,"
                     " shapes: e.querySelectorAll('rect, circle, path, line, polyline, polygon').length}; })")
    assert boxes, "no charts on the page"
    for b in boxes:
        assert b["w"] > 0 and b["h"] > 0 and b["shapes"] > 0, b
    return boxes


def test_run_report_draws_its_charts_without_errors(browser, tmp_path: Path) -> None:
    report = analyse_path(record.materialise("pd002_dataloader_workers"))
    page, errors, dialogs, requests = _open(browser, html.render_report(report), tmp_path)
    boxes = _charts_drawn(page)
    labels = " ".join(b["label"] for b in boxes)
    assert "Step time of each" in labels and "Where the median step goes" in labels
    # memory over the run: one line through every step's memory; the compute panel with its formula
    assert "memory at each step" in labels and page.locator("#memory svg.chart polyline.mem").count() == 1
    assert "FLOP per step" in page.locator("#compute").inner_text()
    # the step chart: one mark per step, the steady-state steps filled
    n = len(report.summary.step_series.ms)
    assert page.locator("#steps svg.chart circle.pt, #steps svg.chart path.off").count() == n
    # the rule's explanation is one click away, and the optional toggle opens every one
    explain = page.locator("details.explain").first
    assert not explain.evaluate("d => d.open")
    page.click("#toggle-explain")
    assert explain.evaluate("d => d.open") and "Why is this bad?" in explain.inner_text()
    assert errors == [] and dialogs == [] and requests == []
    page.context.close()


def test_trace_and_rank_pages_draw_without_errors(browser, tmp_path: Path) -> None:
    traces = REPO / "tests" / "data" / "traces"
    for path in (traces / "kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
                 traces / "param__dlrm_kineto_8ranks"):
        page, errors, dialogs, requests = _open(browser, html.render_report(analyse_path(path)), tmp_path)
        labels = " ".join(b["label"] for b in _charts_drawn(page))
        assert "GPU busy and idle" in labels
        if path.is_dir():
            assert "per rank" in labels and page.locator("#ranks rect.straggler").count() == 1
        assert errors == [] and dialogs == [] and requests == []
        page.context.close()


def test_comparison_page_draws_both_sides(browser, tmp_path: Path) -> None:
    from perfdoctor.gate.compare import compare, load_side

    base = load_side(record.materialise("pd002_dataloader_workers"))
    cur = load_side(record.materialise("pd002_dataloader_workers_fixed"))
    page, errors, dialogs, requests = _open(browser, html.render_comparison(compare(base, cur, 0.10)),
                                            tmp_path)
    labels = " ".join(b["label"] for b in _charts_drawn(page))
    assert "Step time change" in labels and "each baseline and current run" in labels
    assert page.locator("#gate svg.chart circle.dist.base").count() == len(base[0].step_ms)
    assert errors == [] and dialogs == [] and requests == []
    page.context.close()


def test_hostile_input_stays_text(browser, tmp_path: Path) -> None:
    report = analyse_path(record.materialise("pd002_dataloader_workers"))
    report.run = msgspec.structs.replace(report.run, device=HOSTILE, script=f"/tmp/{HOSTILE}.py")
    report.findings = [dataclasses.replace(report.findings[0], title=HOSTILE, message=HOSTILE)]
    page, errors, dialogs, requests = _open(browser, html.render_report(report), tmp_path)
    assert page.locator("img").count() == 0
    assert HOSTILE in page.locator("header").inner_text() and HOSTILE in page.locator("#finding-1").inner_text()
    assert errors == [] and dialogs == [] and requests == []
    page.context.close()


def test_findings_at_a_glance_and_hot_spots_a_click_away_on_a_wide_window(browser, tmp_path: Path) -> None:
    # issue 25: a compact findings table at the top, the hot spots reachable without scrolling past every
    # card, and a layout that uses a wide window
    report = analyse_path(record.materialise("pd002_dataloader_workers"))
    assert report.findings and report.hotspots
    report.findings.append(dataclasses.replace(report.findings[0], rule="PD015", name="persistent-workers",
                                               title="a second finding", ms_per_step=None))
    page, errors, dialogs, requests = _open(browser, html.render_report(report), tmp_path)
    page.set_viewport_size({"width": 1600, "height": 1000})
    rows = page.locator("#summary table.glance tbody tr")
    assert rows.count() == len(report.findings)
    first = report.findings[0]
    cells = rows.first.locator("td").all_inner_texts()
    assert first.rule in cells[1] and cells[2] == first.severity and "/step" in cells[3]
    assert "not measured" in rows.nth(1).locator("td").all_inner_texts()[3]
    glance = page.locator("#summary").bounding_box()
    cards = page.locator("#findings").bounding_box()
    assert glance["y"] < cards["y"] and glance["y"] < 1000  # the table is on the first screen
    # the nav reaches the hot spots: after the click they are on screen
    page.click('nav.toc a[href="#hotspots"]')
    top = page.locator("#hotspots").evaluate("e => e.getBoundingClientRect().top")
    assert 0 <= top < 1000
    # a table row links to its card
    page.click("#summary table.glance tbody tr >> nth=1 >> a")
    assert page.evaluate("location.hash") == "#finding-2"
    # a wide window: the page is wider than the old 820 px column, and the cards stand side by side
    assert page.locator("main").bounding_box()["width"] > 1200
    one, two = page.locator("#finding-1").bounding_box(), page.locator("#finding-2").bounding_box()
    assert abs(one["y"] - two["y"]) < 5 and two["x"] > one["x"] + one["width"] - 1
    assert errors == [] and dialogs == [] and requests == []
    page.context.close()


def test_the_mfu_panel_shows_the_ratio_with_its_formula(browser, tmp_path: Path) -> None:
    from perfdoctor.model import Fact

    report = analyse_path(record.materialise("pd002_dataloader_workers"))
    report.facts.pop("compute.uncounted_convs_per_step", None)  # as for a model of matmuls only
    report.facts["compute.achieved_flops"] = Fact("compute.achieved_flops", 1e10, "number", "trace", "")
    report.facts["compute.peak_flops"] = Fact("compute.peak_flops", 4e10, "number", "machine", "measured")
    report.facts["compute.mfu"] = Fact("compute.mfu", 0.25, "ratio", "trace",
                                       "MFU = FLOPs per step / step time / peak = 1e+08 / 0.01 s / 4e+10 FLOP/s")
    from perfdoctor.contracts.report import ComputeDoc, ComputeModuleDoc

    report.summary.compute = ComputeDoc(source="torch.utils.flop_counter.FlopCounterMode on step 2", flops_per_step=1e8,
                                        modules=[ComputeModuleDoc(module="Net.fc1", layer="Linear_0", flops=6e7, share=0.6,
                                                                  forward_flops=2e7, forward_ms=1.0, achieved_flops=2e10)])
    report.summary.memory.parts = {"params": 2**20, "grads": 2**20, "optimizer_state": 2**21, "activations": 2**23}
    page, errors, dialogs, requests = _open(browser, html.render_report(report), tmp_path)
    panel = page.locator("#compute").inner_text()
    assert "MFU 25.0% = FLOPs per step / step time / peak 40 GFLOP/s" in panel
    assert "(torch.utils.flop_counter.FlopCounterMode on step 2)" in panel  # what counted the FLOPs
    assert "Net.fc1" in page.locator("#compute-modules").inner_text()  # the modules by FLOPs, their rate
    # the peak broken down as one bar: parameters, gradients, optimizer state, activations, the rest
    bar = page.locator("#memory svg.chart").nth(1)
    assert "by what holds it" in bar.get_attribute("aria-label") and bar.bounding_box()["width"] > 0
    assert "activations 8.0 MiB" in page.locator("#memory").inner_text()
    assert "1e+08 / 0.01 s / 4e+10 FLOP/s" in page.locator("#compute p.formula").inner_text()
    assert page.locator('#compute data[data-key="compute.mfu"]').get_attribute("value") == "0.25"
    assert errors == [] and dialogs == [] and requests == []
    page.context.close()
