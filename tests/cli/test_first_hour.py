"""Issue 25, a user's first hour: the rough edges a new user met, each pinned by a test that failed
before its fix. The scripted walkthrough itself is tests/cli/test_first_hour_e2e.py."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from perfdoctor.contracts.report import HotLineDoc, RunInfoDoc, SummaryDoc
from perfdoctor.gate.compare import compare
from tests.gate.test_gate import ENV, runs
from tests.helpers import REPO, TESTS, run_cli


def _lines(p) -> list[str]:
    return [line for line in p.stderr.splitlines() if line.strip()]


def test_debug_after_the_command_is_perfdoctors_not_a_script(tmp_path: Path) -> None:
    p = run_cli("run", "--debug", str(tmp_path / "nothere.py"), cwd=tmp_path)
    assert p.returncode == 2
    assert "--debug: no such script" not in p.stderr and "nothere.py: no such script" in p.stderr


def test_debug_shows_the_traceback_and_keeps_the_exit_code(tmp_path: Path) -> None:
    p = run_cli("--debug", "run", "nothere.py", cwd=tmp_path)
    assert p.returncode == 2, p.stderr  # bad input, never the gate-failed 1
    assert "Traceback" in p.stderr and _lines(p)[-1] == "perfdoctor: error: nothere.py: no such script"
    p = run_cli("run", "nothere.py", cwd=tmp_path)
    assert p.returncode == 2 and len(_lines(p)) == 1 and "Traceback" not in p.stderr


def test_rules_refuses_a_format_it_cannot_write() -> None:
    for fmt in ("html", "markdown", "sarif"):
        p = run_cli("rules", "--format", fmt)
        assert p.returncode == 2 and not p.stdout, (fmt, p.stdout[:200])
        assert "'text', 'json'" in p.stderr
    assert json.loads(run_cli("rules", "--format", "json").stdout)[0]["id"] == "PD001"


def test_unknown_option_before_dashes_is_an_error_with_a_hint(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    p = run_cli("run", str(script), "--workers", "2", cwd=tmp_path)
    assert p.returncode == 2 and "ran" not in p.stdout + p.stderr
    assert len(_lines(p)) == 1 and "no such option: --workers" in p.stderr and "-- --workers 2" in p.stderr
    p = run_cli("run", str(script), "--step", "3", cwd=tmp_path)
    assert p.returncode == 2 and "did you mean --steps?" in p.stderr
    assert not (tmp_path / ".perfdoctor").exists()  # refused before anything ran


def test_report_of_a_run_folders_file_points_at_the_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text("{}")
    (run / "report.json").write_text(json.dumps({"schema": "perfdoctor/report/v1", "findings": []}))
    p = run_cli("report", str(run / "report.json"), cwd=tmp_path)
    assert p.returncode == 2 and len(_lines(p)) == 1
    assert f"give the folder, `perfdoctor report {run}`" in p.stderr


def test_compare_judges_different_arguments_when_told_they_changed_on_purpose() -> None:
    rng = random.Random(7)
    base = runs(2, 50, 20.0, rng)
    cur = runs(2, 50, 30.0, rng)
    for r in cur:
        r.env["args"] = ["--lr", "0.2"]
    c = compare(base, cur)
    assert c.verdict == "not-comparable" and not c.failed
    assert "--allow-different-args" in c.notes[0]
    c = compare(base, cur, allow_different_args=True)
    assert c.comparable and c.failed and c.rows[0].verdict == "regression"
    assert any("arguments differ, judged anyway" in n for n in c.notes)
    cur[0].env["torch"] = cur[1].env["torch"] = "2.12.0"  # anything else that differs still stops it
    assert compare(base, cur, allow_different_args=True).verdict == "not-comparable"
    assert ENV["torch"] != "2.12.0"


def test_compare_command_has_the_option() -> None:
    p = run_cli("compare", "--help")
    assert "--allow-different-args" in p.stdout


def test_readme_names_only_options_that_exist() -> None:
    readme = (REPO / "README.md").read_text()
    assert "--rebaseline" not in readme


# -- runs that go wrong ----------------------------------------------------------------------------

def test_status_line_says_starting_and_how_long_the_first_step_is_awaited(tmp_path: Path, monkeypatch) -> None:
    import io
    import sys

    from perfdoctor.capture import runner

    err = io.StringIO()  # not a terminal: a CI log
    monkeypatch.setattr(sys, "stderr", err)
    clock = [1000.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    status = runner._Status("train.py", tmp_path / "steps.partial.jsonl", runner.Progress(None, 13), "run 2 of 3")
    status.start()
    for _ in range(70):  # 35 s without a step
        clock[0] += 0.5
        status.poll()
    lines = err.getvalue().splitlines()
    assert lines[0] == "perfdoctor: running train.py (run 2 of 3): starting"
    assert lines[1:] == [f"perfdoctor: running train.py (run 2 of 3): waiting for the first step: {s} s"
                         for s in (10, 20, 30)]


def _frame(function: str, file: str, line: int = 1):
    from perfdoctor.contracts.run import StuckFrame

    return StuckFrame(function=function, file=file, line=line)


def test_a_stuck_stack_keeps_the_scripts_frames_and_none_once_the_script_ended() -> None:
    from perfdoctor.capture.runner import _PACKAGE, _script_frames

    child = _frame("main", f"{_PACKAGE}/capture/child.py")
    torch_next = _frame("_BaseDataLoaderIter.__next__", "/venv/torch/utils/data/dataloader.py")
    probe = _frame("__next__", f"{_PACKAGE}/capture/probes/dataloader.py")
    user = _frame("<module>", "/home/u/train.py", 10)
    runpy = _frame("run_path", "<frozen runpy>")
    assert _script_frames([torch_next, probe, user, runpy, child], "main") == [torch_next, user]
    assert _script_frames([_frame("_del_library", "/venv/torch/library.py"), child], "main") is None  # finalising
    worker = [_frame("DS.__getitem__", "/home/u/train.py", 6), _frame("_worker_loop", "/venv/torch/worker.py"),
              torch_next, user, runpy, child]
    assert _script_frames(worker, "child") == worker[:1]


def _failed_run(folder: Path, reason: str, traceback: str | None, stuck: dict | None = None) -> Path:
    folder.mkdir()
    (folder / "train.py").write_text("x = (1,\n")
    meta = {"schema": "perfdoctor/run/v1", "script": str(folder / "train.py"), "argv": ["train.py"],
            "exit": {"code": 1 if reason == "exception" else 130, "reason": reason, "traceback": traceback},
            "step_clock": "none", "complete": True, "env": {"cpu_count": 2}}
    (folder / "meta.json").write_text(json.dumps(meta))
    (folder / "steps.json").write_text(json.dumps({"steps": [{"i": 1, "end_s": 0.1, "wall_ms": 6.5, "data_ms": 6.0}]}))
    if stuck is not None:
        (folder / "stuck.json").write_text(json.dumps(stuck))
    return folder


def test_a_syntax_error_is_no_measurement_and_names_its_line(tmp_path: Path) -> None:
    from perfdoctor.analysis import analyse_run

    tb = 'Traceback (most recent call last):\n  File "/x/train.py", line 3\n    def f(:\n    ^\nSyntaxError: invalid syntax\n'
    report = analyse_run(_failed_run(tmp_path / "run", "exception", tb))
    assert report.summary.steps_observed == 0 and not report.summary.step_time_ms
    assert not report.summary.breakdown and "step.time_ms" not in report.facts
    assert "the script failed before its first step ended: SyntaxError: invalid syntax (train.py:3)" in report.notes
    assert report.measured_nothing and not any("whole run is one span" in n for n in report.notes)


def test_a_run_stuck_before_its_first_step_says_where(tmp_path: Path) -> None:
    from perfdoctor.analysis import analyse_run

    user = str(tmp_path / "run" / "train.py")
    stuck = {"after_s": 30.4, "processes": [
        {"pid": 1, "role": "main", "frames": [
            {"function": "Queue.get", "file": "/usr/lib/python3.11/multiprocessing/queues.py", "line": 113},
            {"function": "_BaseDataLoaderIter.__next__", "file": "/venv/torch/utils/data/dataloader.py", "line": 725},
            {"function": "<module>", "file": user, "line": 10}]},
        *({"pid": p, "role": "child", "frames": [{"function": "DS.__getitem__", "file": user, "line": 6}]}
          for p in (2, 3))]}
    report = analyse_run(_failed_run(tmp_path / "run", "interrupted", None, stuck))
    assert report.notes[0] == (
        "no step ended: after 30.4 s the script was still before its first step; its main thread was at "
        "train.py:10 in <module> (waiting for a DataLoader batch); the processes under it (DataLoader workers) "
        "were at train.py:6 in DS.__getitem__ (2 processes) (py-spy dump; stuck.json in the run folder has the "
        "stacks)")
    assert report.summary.stuck.processes[1].frames[0].line == 6
    assert report.measured_nothing  # not "No problems found by the rules"


# -- identical findings are one, with their locations -----------------------------------------------

CONVS = """\
import torch.nn as nn

def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3), nn.BatchNorm2d(cout))

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
        self.b = nn.Sequential(nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8))
        self.c = nn.Conv1d(8, 8, 3)
        self.n = nn.BatchNorm1d(8)

    def forward(self, x):
        return self.n(self.c(self.b(self.a(x)).flatten(2)))
"""


def test_identical_findings_are_one_with_every_location_in_every_format(tmp_path: Path) -> None:
    from perfdoctor.facts.model import Facts
    from perfdoctor.facts.static import analyse_files
    from perfdoctor.model import Report
    from perfdoctor.report.formats import render
    from perfdoctor.rules.config import Settings
    from perfdoctor.rules.engine import judge
    from tests.rules.test_gpu_static_rules import RULES, machine

    path = tmp_path / "train.py"
    path.write_text(CONVS)
    facts = machine(Facts())
    analyse_files([path], facts)
    found = [f for f in judge(facts, RULES, Settings(project=tmp_path)) if f.rule == "PD028"]
    by_layer = {f.title.split()[0]: f for f in found}
    assert sorted(by_layer) == ["Conv1d", "Conv2d"]  # different words: two findings
    conv2d = by_layer["Conv2d"]
    assert [loc.line for loc in conv2d.locations] == [4, 9, 10]
    assert conv2d.fix is not None and "The same change at each location listed." in conv2d.fix.note
    report = Report(run=RunInfoDoc(kind="trace", trace=str(path)), summary=SummaryDoc(), findings=found)
    doc = json.loads(render("json", report, None))
    assert [len(f["locations"]) for f in doc["findings"] if f["rule"] == "PD028"] in ([3, 1], [1, 3])
    from rich.console import Console

    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    console.print(render("text", report, None))
    shown = console.export_text()
    assert shown.count("PD028 conv-bias-before-bn") == 2
    assert all(f"train.py:{n}" in shown for n in (4, 9, 10, 11)), shown
    md = render("markdown", report, None)
    assert "train.py:4 and 2 more" in md
    gh = render("github", report, None)
    assert sum("line=" in line and "PD028" in line for line in gh.splitlines()) == 4
    html = render("html", report, None)
    assert all(f"train.py:{n}</code>" in html for n in (4, 9, 10))


# -- numbers and words that mislead ----------------------------------------------------------------

def test_gate_table_at_80_columns_cuts_no_cell_and_labels_estimate_and_interval() -> None:
    from rich.console import Console

    from perfdoctor.gate.compare import Comparison, Row
    from perfdoctor.report.text import render_comparison

    rows = [Row("step time (p10)", "ms", 32.8, 83.6, 154.8, (32.6, 44.0), "regression", "timing", "interval"),
            Row("ops.calls_per_step", "count/step", 1234.0, 1500.0, 21.6, None, "regression", "counter", "values")]
    c = Comparison(failed=True, comparable=True, rows=rows, new_findings=[], resolved_findings=[], notes=[],
                   baseline_runs=3, current_runs=3)
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    console.print(render_comparison(c))
    shown = console.export_text()
    assert "…" not in shown, shown
    assert "+32.6% to" in shown and "+44.0%" in shown and "(estimate)" in shown and "interval" in shown
    assert "lies outside its 90% interval" in " ".join(shown.split())


def test_hot_lines_say_their_share_is_self_time() -> None:
    from rich.console import Console

    from perfdoctor.model import Hotspot, Report
    from perfdoctor.report.text import render_report

    h = Hotspot("forward", "/x/model.py", 38, 12.0, 1.0,
                lines=[HotLineDoc(line=40, code="x = self.tok(idx) + self.pos(pos)", share=0.55)])
    console = Console(width=160, record=True, file=open(os.devnull, "w"))
    console.print(render_report(Report(run=RunInfoDoc(), summary=SummaryDoc(), findings=[], hotspots=[h])))
    assert "hot lines (self time)" in console.export_text()


def test_a_trace_alone_names_no_start_frame_and_says_which_machine_facts_it_lacks() -> None:
    from perfdoctor.analysis import analyse_path

    trace = TESTS / "data" / "traces" / "torch213_cpu_mlp_dataloader.pt.trace.json.gz"
    report = analyse_path(trace)
    (pd002,) = [f for f in report.findings if f.rule == "PD002"]
    # record_cpu_trace.py(22): <module> began with the profiler: its line is where profiling started
    # (the loop's `prof.step()`), not where the DataLoader is
    assert pd002.locations == []
    lacking = [n for n in report.notes if n.startswith("a trace alone does not hold")]
    assert len(lacking) == 1 and "cpu.count" in lacking[0] and "PD002" in lacking[0]
    assert "cpu.local_ranks" not in lacking[0]


def test_gate_interval_survives_a_noisy_two_run_baseline() -> None:
    # found by the first-hour walkthrough on a loaded machine: two baseline runs at 20 and 54 ms give a
    # between-run variance with one degree of freedom, whose posterior draws a run effect of exp(±1000):
    # the gate died with "StatisticsError: fmean requires at least one data point"
    import math
    import random

    from perfdoctor.gate import stats

    rng = random.Random(3)
    base = [[20 + rng.random() for _ in range(26)], [54 + rng.random() for _ in range(26)]]
    cur = [[54 + rng.random() for _ in range(26)]]
    sigma = stats.between_run_log_var([20.0, 54.0], [1e-5, 1e-5])
    for seed in range(10):
        point, lo, hi = stats.ratio_interval(base, cur, sigma, df=1, seed=seed)
        assert 0 < lo <= hi and math.isfinite(point)


def test_a_stuck_runs_report_writes_and_reads_back(tmp_path: Path) -> None:
    from perfdoctor.analysis import analyse_path, analyse_run, write_run_reports

    user = str(tmp_path / "run" / "train.py")
    stuck = {"after_s": 12.0, "processes": [{"pid": 1, "role": "main", "frames": [
        {"function": "<module>", "file": user, "line": 10}]}]}
    run = _failed_run(tmp_path / "run", "interrupted", None, stuck)
    write_run_reports(analyse_run(run), run)  # report.json holds summary.stuck, checked against its contract
    again = analyse_path(run / "report.json")
    assert again.summary.stuck.processes[0].frames[0].line == 10
