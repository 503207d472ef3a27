"""Hostile inputs (issue 9) as fixed regression cases, each through the real CLI (in process): a
trace, a folder, a run folder, a baseline, a report.json, a config or a rule file that is malformed
or built to hurt. Each must finish within seconds with either one error line naming the file (exit
2) or a report; never a traceback, an "internal error", a hang or a read of a file that is not the
user's own source."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from perfdoctor.cli import main
from perfdoctor.trace import loader
from tests.helpers import TESTS

GOLDEN_RUN = TESTS / "golden" / "runs" / "pd002_dataloader_workers"
LIMIT_S = 20  # every case takes well under a second; a hang hits this


class Hang(BaseException):
    """Raised by the alarm; a BaseException, so that the CLI's catch-all cannot swallow it."""


def _alarm(signum, frame):
    raise Hang()


def cli(tmp_path: Path, monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run `perfdoctor ARGS` in process from `tmp_path` (the current directory): exit code, stdout, stderr."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["perfdoctor", *map(str, args)])
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT_S)
    start = time.monotonic()
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0
    except Hang:
        pytest.fail(f"perfdoctor {' '.join(map(str, args))} hung for {LIMIT_S} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out, err = capsys.readouterr()
    assert time.monotonic() - start < LIMIT_S
    return code, out, err


def error_line(code: int, out: str, err: str, names: str) -> str:
    """Exit 2 and one stderr line, naming `names` (the file); nothing on stdout."""
    assert code == 2, err
    assert out == "", out
    assert "internal error" not in err and "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("perfdoctor: error: "), err
    assert names in lines[0], err
    return lines[0]


def reported(code: int, out: str, err: str) -> dict:
    """A JSON report came out (exit 0 or 1), and nothing went wrong on stderr."""
    assert code in (0, 1), err
    assert "internal error" not in err and "Traceback" not in err, err
    return json.loads(out)


# -- traces ----------------------------------------------------------------------------------------

def ev(name, cat, ts, dur, **args) -> dict:
    e = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def write_trace(path: Path, events: list, **top) -> Path:
    path.write_text(json.dumps({"traceEvents": events, **top}))
    return path


def loader_steps(frame: str, n: int = 4, py_args: dict | None = None) -> list[dict]:
    """n ProfilerSteps of 10 ms, each spent 8 ms waiting in the DataLoader under the Python frame `frame`."""
    events = []
    for i in range(n):
        t = i * 10_000
        events += [ev(f"ProfilerStep#{i}", "user_annotation", t, 10_000),
                   ev(frame, "python_function", t + 10, 9_000, **(py_args or {})),
                   ev("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", t + 20, 8_000)]
    return events


@pytest.mark.parametrize("py_args", [
    {},  # no `Python id` / `Python parent id`: both read as absent (the event was its own parent)
    {"Python id": 5, "Python parent id": 5},  # explicitly its own parent
], ids=["no-ids", "equal-ids"])
def test_a_python_event_that_is_its_own_parent_does_not_hang(tmp_path, monkeypatch, capsys, py_args):
    # a frame that is not the user's, so that the walk goes on to the caller
    t = write_trace(tmp_path / "t.json", loader_steps("threading.py(1): run", py_args=py_args))
    reported(*cli(tmp_path, monkeypatch, capsys, "report", t, "--format", "json"))


def test_a_cycle_of_python_parents_does_not_hang(tmp_path, monkeypatch, capsys):
    events = loader_steps("threading.py(1): run", py_args={"Python id": 1, "Python parent id": 2})
    events += [ev("threading.py(2): loop", "python_function", 5, 40_000, **{"Python id": 2, "Python parent id": 3}),
               ev("threading.py(3): loop", "python_function", 0, 41_000, **{"Python id": 3, "Python parent id": 1})]
    t = write_trace(tmp_path / "t.json", events)
    reported(*cli(tmp_path, monkeypatch, capsys, "report", t, "--format", "json"))


def test_a_frame_naming_a_device_is_never_read(tmp_path, monkeypatch, capsys):
    """`/dev/zero(22): <module>` as the user's frame: the ignore-comment lookup and the fixer read
    only regular files inside the project (or the run's own files), capped."""
    t = write_trace(tmp_path / "t.json", loader_steps("/dev/zero(22): <module>"))
    rep = reported(*cli(tmp_path, monkeypatch, capsys, "report", t, "--format", "json"))
    assert any(loc["file"] == "/dev/zero" for f in rep["findings"] for loc in f["locations"]), rep["findings"]


def test_a_frame_naming_a_fifo_in_the_project_is_never_read(tmp_path, monkeypatch, capsys):
    os.mkfifo(tmp_path / "pipe.py")  # opening it for reading would block until a writer comes
    t = write_trace(tmp_path / "t.json", loader_steps("pipe.py(3): main"))
    rep = reported(*cli(tmp_path, monkeypatch, capsys, "report", t, "--format", "json"))
    assert any(loc["file"] == "pipe.py" for f in rep["findings"] for loc in f["locations"])


def test_the_ignore_comment_is_read_in_the_project_only(tmp_path, monkeypatch, capsys):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("\n" * 21 + "for x in loader:  # perfdoctor: ignore\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "train.py").write_text("\n" * 21 + "for x in loader:  # perfdoctor: ignore\n")
    inside = write_trace(tmp_path / "in.json", loader_steps(f"{tmp_path}/proj/train.py(22): main"))
    outside = write_trace(tmp_path / "out.json", loader_steps(f"{tmp_path}/other/train.py(22): main"))
    monkeypatch.chdir(tmp_path / "proj")
    code, out, err = cli(tmp_path / "proj", monkeypatch, capsys, "report", inside, "--format", "json")
    assert reported(code, out, err)["findings"] == []  # its own source: the comment applies
    code, out, err = cli(tmp_path / "proj", monkeypatch, capsys, "report", outside, "--format", "json")
    assert reported(code, out, err)["findings"] != []  # another project's file: not read


def test_deeply_nested_json_is_one_error_line(tmp_path, monkeypatch, capsys):
    deep = "[" * 100_000 + "]" * 100_000
    for name, text in [("top.json", '{"traceEvents": ' + deep + "}"),
                       ("args.json", '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, '
                                     '"args": {"Bytes": ' + deep + "}}]}"),
                       ("bare.json", deep)]:
        (tmp_path / name).write_text(text)
        error_line(*cli(tmp_path, monkeypatch, capsys, "report", tmp_path / name), name)


def test_a_huge_name_is_cut_and_counted(tmp_path, monkeypatch, capsys):
    """A 5 MB step-like operator name (digits then a letter: a backtracking regex's worst case)."""
    name = "step " + "1" * (5 << 20) + "x"
    events = loader_steps("train.py(3): main") + [ev(name, "user_annotation", 1, 1)]
    t = write_trace(tmp_path / "t.json", events)
    rep = reported(*cli(tmp_path, monkeypatch, capsys, "report", t, "--format", "json"))
    assert any("1 with a string over 64 KB cut" in n for n in rep["notes"]), rep["notes"]


def test_an_event_over_the_limit_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(loader, "MAX_EVENT_BYTES", 1 << 20)
    monkeypatch.setattr(loader, "CHUNK", 1 << 20)
    monkeypatch.setattr(loader, "READ_SIZE", 256 << 10)
    events = loader_steps("train.py(3): main") + [ev("x" * (4 << 20), "cpu_op", 1, 1)] + loader_steps("a.py(1): f")
    t = write_trace(tmp_path / "t.json", events)
    assert "an event over 1 MB" in error_line(*cli(tmp_path, monkeypatch, capsys, "report", t), "t.json")


def test_a_file_without_trace_events_is_not_buffered_whole(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(loader, "MAX_HEAD", 2 << 20)
    p = tmp_path / "big.json"
    p.write_text('{"other": "' + "x" * (8 << 20) + '"}')
    assert "no `traceEvents` array in its first 2 MB" in error_line(*cli(tmp_path, monkeypatch, capsys, "report", p),
                                                                   "big.json")


def test_a_gzip_bomb_is_one_error_line(tmp_path, monkeypatch, capsys):
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (24 << 20) + b"]}", 9))  # 1000x
    monkeypatch.setattr(loader, "MIN_EXPANDED", 4 << 20)
    assert "expands more than" in error_line(*cli(tmp_path, monkeypatch, capsys, "report", p), "bomb.json.gz")


def test_too_many_events_per_mb_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(loader, "MIN_EVENTS", 1000)
    monkeypatch.setattr(loader, "EVENTS_PER_MB", 1000)
    p = tmp_path / "many.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": loader_steps("a.py(1): f", n=2000)}).encode(), 9))
    assert "more than 1000 events" in error_line(*cli(tmp_path, monkeypatch, capsys, "report", p), "many.json.gz")


def test_a_bare_event_array_is_streamed(tmp_path, monkeypatch, capsys):
    p = tmp_path / "bare.json"
    p.write_text(json.dumps(loader_steps("train.py(3): main")))
    assert reported(*cli(tmp_path, monkeypatch, capsys, "report", p, "--format", "json"))["findings"]


def test_unusable_events_are_dropped_and_counted(tmp_path, monkeypatch, capsys):
    """String `ts`, a kernel without name, ts or dur (it made a HIGH PD009), times past 1e20,
    negative durations and ids past 64 bits: dropped or repaired, and a note says how many."""
    events = loader_steps("train.py(3): main")
    events += [ev("k", "kernel", "12", 5), {"ph": "X", "cat": "kernel", "pid": 1, "tid": 7},
               {"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 7, "dur": 3},
               {"ph": "X", "cat": "kernel", "ts": 5, "dur": 3, "pid": 1, "tid": 7},
               ev("k", "kernel", 5, None), ev("k", "kernel", 1e300, 1), ev("op", "cpu_op", 5, -3),
               ev("op", "cpu_op", 6, 1, **{"External id": 2**70})]
    t = write_trace(tmp_path / "t.json", events)
    rep = reported(*cli(tmp_path, monkeypatch, capsys, "report", t, "--format", "json"))
    assert not any(f["rule"] == "PD009" for f in rep["findings"])
    (note,) = [n for n in rep["notes"] if n.startswith("trace events dropped or repaired")]
    for part in ("1 with wrong-typed fields", "2 without a name", "1 without a timestamp", "1 without a duration",
                 "1 with a time beyond 1e20", "1 with a negative duration set to 0",
                 "1 with an id or size beyond 64 bits ignored"):
        assert part in note, note
    md = cli(tmp_path, monkeypatch, capsys, "report", t, "--format", "markdown")[1]
    assert "trace events dropped or repaired" in md
    text = cli(tmp_path, monkeypatch, capsys, "report", t)[1]
    assert "trace events dropped or repaired" in text


@pytest.mark.parametrize("body", [b"", b"5", b'"x"', b"{}", b"[]", b"[1, 2]", b'{"traceEvents": 5}',
                                  b'{"traceEvents": [5, "x", null]}', b'{"traceEvents": [{"ph": "X"}]',
                                  b"\xff\xfe", b"\x1f\x8b\x08\x00garbage"])
def test_malformed_traces_are_one_error_line(tmp_path, monkeypatch, capsys, body):
    p = tmp_path / "bad.json"
    p.write_bytes(body)
    error_line(*cli(tmp_path, monkeypatch, capsys, "report", p), "bad.json")


# -- config and rule files -------------------------------------------------------------------------

GOOD_TRACE = TESTS / "data" / "traces" / "torch213_cpu_mlp_dataloader.pt.trace.json.gz"
RULE = """id = "{id}"
name = "budget"
severity = "high"
summary = "s"
when = "{when}"
title = "{title}"
message = "m"
[doc]
what = "w"
why = "y"
"""


def project(tmp_path: Path, config: str, rules: dict[str, str] | None = None) -> Path:
    (tmp_path / "pyproject.toml").write_text(config)
    for name, body in (rules or {}).items():
        (tmp_path / "perf").mkdir(exist_ok=True)
        (tmp_path / "perf" / name).write_text(body)
    return tmp_path


@pytest.mark.parametrize("config,words", [
    ("tool = 5", "`tool` must be a table"),
    ("[tool]\nperfdoctor = 5", "[tool.perfdoctor] must be a table"),
    ("[tool.perfdoctor]\nignore = 5", "ignore must be a list of strings"),
    ("[tool.perfdoctor]\nbogus = 1", "unknown [tool.perfdoctor] setting"),
    ("[tool.perfdoctor.thresholds.PD002]\nmin_wait_fraction = nan", "must be a finite number"),
    ("[tool.perfdoctor.thresholds.PD002]\nmin_wait_fraction = inf", "must be a finite number"),
    ('[tool.perfdoctor.thresholds.PD002]\nmin_wait_fraction = "0.5"', "must be a finite number"),
    ("[tool.perfdoctor.thresholds.PD002]\nmin_wait_fraction = true", "must be a finite number"),
    ("[tool.perfdoctor.thresholds.PD002]\nnope = 1", "has no such threshold"),
    ("[tool.perfdoctor.thresholds.PD999]\nx = 1", "no rule PD999"),
    ('[tool.perfdoctor]\nextend-rules = ["/etc"]', "inside the project"),
    ('[tool.perfdoctor]\nextend-rules = ["../.."]', "inside the project"),
    ('[tool.perfdoctor]\nextend-rules = ["perf/../../x"]', "inside the project"),
    ("[tool.perfdoctor\n", "cannot read"),
    ("a = " + "[" * 5000 + "]" * 5000, "cannot read"),
])
def test_bad_configs_are_one_error_line(tmp_path, monkeypatch, capsys, config, words):
    project(tmp_path, config)
    assert words in error_line(*cli(tmp_path, monkeypatch, capsys, "report", GOOD_TRACE), "pyproject.toml")


@pytest.mark.parametrize("rule,words", [
    (RULE.format(id="PD002", when="true", title="t"), "already taken by a built-in rule"),
    (RULE.format(id="XY001", when="(((9**64)**64)**64)**64 > 0", title="t"), "over 256 bits"),
    (RULE.format(id="XY001", when="round(1, -10**9) > 0", title="t"), "at most 20 digits"),
    (RULE.format(id="XY001", when="1 " + "+ 1 " * 600 + "> 0", title="t"), "too long"),
])
def test_bad_project_rules_are_one_error_line(tmp_path, monkeypatch, capsys, rule, words):
    project(tmp_path, '[tool.perfdoctor]\nextend-rules = ["perf"]', {"r.toml": rule})
    start = time.monotonic()
    line = error_line(*cli(tmp_path, monkeypatch, capsys, "report", GOOD_TRACE), "")
    assert words in line and time.monotonic() - start < 5, line


def test_a_template_past_4300_digits_renders_as_unknown(tmp_path, monkeypatch, capsys):
    rule = RULE.format(id="XY001", when="true", title="{((9**64)**64)**2}")
    project(tmp_path, '[tool.perfdoctor]\nextend-rules = ["perf"]', {"r.toml": rule})
    rep = reported(*cli(tmp_path, monkeypatch, capsys, "report", GOOD_TRACE, "--format", "json"))
    assert [f["title"] for f in rep["findings"] if f["rule"] == "XY001"] == ["?"]


def test_config_changes_are_shown(tmp_path, monkeypatch, capsys):
    """A blanket `ignore = ["PD"]` still works, and says so; so do moved thresholds and project rules."""
    rule = RULE.format(id="XY001", when="true", title="t")
    project(tmp_path, '[tool.perfdoctor]\nignore = ["PD"]\nextend-rules = ["perf"]\n'
                      "[tool.perfdoctor.thresholds.PD002]\nmin_wait_fraction = 0.5\n", {"r.toml": rule})
    rep = reported(*cli(tmp_path, monkeypatch, capsys, "report", GOOD_TRACE, "--format", "json"))
    assert [f["rule"] for f in rep["findings"]] == ["XY001"]
    cfg = rep["run"]["config"]
    assert "PD002" in cfg["rules_off"] and "XY001" not in cfg["rules_off"]
    assert cfg["thresholds"] == [{"rule": "PD002", "name": "min_wait_fraction", "default": 0.1, "value": 0.5}]
    assert [r["id"] for r in cfg["project_rules"]] == ["XY001"]
    assert any("rules turned off: PD001" in n for n in rep["notes"])
    for fmt in ("text", "markdown"):
        out = cli(tmp_path, monkeypatch, capsys, "report", GOOD_TRACE, "--format", fmt)[1]
        assert "thresholds changed: PD002.min_wait_fraction 0.1 -> 0.5" in " ".join(out.split())
    sarif = json.loads(cli(tmp_path, monkeypatch, capsys, "report", GOOD_TRACE, "--format", "sarif")[1])
    assert sarif["runs"][0]["properties"]["perfdoctorConfig"]["rules_off"] == cfg["rules_off"]


def test_config_is_never_read_from_the_traces_folder(tmp_path, monkeypatch, capsys):
    shared = tmp_path / "shared"
    (shared / "traces").mkdir(parents=True)
    project(shared, '[tool.perfdoctor]\nignore = ["PD"]')
    t = shared / "traces" / "t.json"
    t.write_text(json.dumps({"traceEvents": loader_steps("train.py(3): main")}))
    (tmp_path / "here").mkdir()
    rep = reported(*cli(tmp_path / "here", monkeypatch, capsys, "report", t, "--format", "json"))
    assert rep["findings"] and rep["run"]["settings"] is None and "config" not in rep["run"]
    # ...but `--config` names it
    rep = reported(*cli(tmp_path / "here", monkeypatch, capsys, "report", t, "--format", "json",
                        "--config", shared / "pyproject.toml"))
    assert rep["findings"] == [] and rep["run"]["config"]["rules_off"]
    error_line(*cli(tmp_path / "here", monkeypatch, capsys, "report", t, "--config", tmp_path / "nope.toml"),
               "nope.toml")


# -- baselines, report.json, run folders -------------------------------------------------------------

def baseline(tmp_path: Path) -> dict:
    from perfdoctor.gate.baseline import RunRecord, save_baseline

    records = [RunRecord(source=f"r{i}", env={"torch": "2.3", "device": "cpu"}, median_ms=10.0 + i,
                         step_ms=[10.0 + i + 0.1 * (j % 3) for j in range(20)]) for i in range(3)]
    p = tmp_path / "base.json"
    save_baseline(records, p)
    return json.loads(p.read_text())


def _set(doc: dict, path: str, value) -> dict:
    keys = path.split(".")
    d = doc
    for k in keys[:-1]:
        d = d[int(k)] if isinstance(d, list) else d[k]
    d[int(keys[-1]) if isinstance(d, list) else keys[-1]] = value
    return doc


BAD_BASELINES = {
    "runs-string": ("runs", "abc"),
    "runs-strings": ("runs", ["abc"]),
    "runs-empty": ("runs", []),
    "findings-string": ("findings", "abc"),
    "run-findings-string": ("runs.0.findings", "abc"),
    "steps-zero": ("runs.0.step_ms", [0.0] * 20),
    "steps-1e308": ("runs.0.step_ms", [1e308] * 20),
    "steps-negative": ("runs.0.step_ms", [-5.0] * 20),
    "median-1e308": ("runs.0.median_ms", 1e308),
    "median-negative": ("runs.0.median_ms", -1.0),
    "env-string": ("runs.0.env", "abc"),
    "env-nested": ("runs.0.env", {"torch": {"a": 1}}),
    "environment-list": ("environment", [1, 2]),
    "counters-string": ("runs.0.counters", {"ops.calls_per_step": "many"}),
    "noise-string": ("noise", "abc"),
    "future-schema": ("schema", "perfdoctor/baseline/v2"),
    "schema-number": ("schema", 5),
}


@pytest.mark.parametrize("case", sorted(BAD_BASELINES))
def test_malformed_baselines_are_one_error_line(tmp_path, monkeypatch, capsys, case):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(baseline(tmp_path)))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_set(baseline(tmp_path), *BAD_BASELINES[case])))
    line = error_line(*cli(tmp_path, monkeypatch, capsys, "compare", bad, good), "bad.json")
    if case == "future-schema":
        assert "perfdoctor/baseline/v2" in line and "does not read" in line
    error_line(*cli(tmp_path, monkeypatch, capsys, "compare", good, bad), "bad.json")


def test_a_good_baseline_still_compares(tmp_path, monkeypatch, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(baseline(tmp_path)))
    code, out, err = cli(tmp_path, monkeypatch, capsys, "compare", good, good, "--format", "json")
    assert code == 0, err


@pytest.mark.parametrize("doc", [
    {"schema": "perfdoctor/report/v9", "summary": {}, "findings": []},
    {"schema": "perfdoctor/report/v1", "summary": "x", "findings": []},
    {"schema": "perfdoctor/report/v1", "summary": {"step_time_ms": {"median": -3}}, "findings": []},
    {"schema": "perfdoctor/report/v1", "summary": {"step_time_ms": {"median": 1e308}}, "findings": []},
    {"schema": "perfdoctor/report/v1", "summary": {}, "findings": ["x"]},
], ids=["future", "summary-string", "median-negative", "median-1e308", "findings-strings"])
def test_malformed_reports_are_one_error_line(tmp_path, monkeypatch, capsys, doc):
    p = tmp_path / "report.json"
    p.write_text(json.dumps(doc))
    error_line(*cli(tmp_path, monkeypatch, capsys, "compare", p, p), "report.json")


RUN_FILES = {
    "steps-string": ("steps.json", {"steps": "abc"}),
    "step-i-string": ("steps.json", {"steps": [{"i": "a", "wall_ms": 1.0}]}),
    "step-negative": ("steps.json", {"steps": [{"i": 1, "wall_ms": -1.0}]}),
    "step-1e308": ("steps.json", {"steps": [{"i": 1, "wall_ms": 1e308}]}),
    "steps-list": ("steps.json", [1, 2]),
    "meta-env-number": ("meta.json", "env=5"),
    "meta-argv-string": ("meta.json", "argv=abc"),
    "meta-window-list": ("meta.json", "window=[]"),
    "meta-future": ("meta.json", "schema=perfdoctor/run/v7"),
    "meta-deep": ("meta.json", "deep"),
    "probes-string": ("probes.json", {"dataloaders": "x"}),
    "hotspots-devzero": ("hotspots.json", "devzero"),
}


@pytest.mark.parametrize("case", sorted(RUN_FILES))
def test_malformed_run_folders(tmp_path, monkeypatch, capsys, case):
    run = tmp_path / "run"
    shutil.copytree(GOLDEN_RUN, run)
    name, value = RUN_FILES[case]
    if name == "meta.json":
        meta = json.loads((run / "meta.json").read_text())
        if value == "deep":
            (run / name).write_text('{"schema": "perfdoctor/run/v1", "env": ' + "[" * 50_000 + "]" * 50_000 + "}")
        else:
            key, _, v = value.partition("=")
            meta[key] = 5 if v == "5" else [] if v == "[]" else v
            (run / name).write_text(json.dumps(meta))
    elif value == "devzero":
        hs = json.loads((run / name).read_text())
        hs["functions"] = [{"function": "f", "file": "/dev/zero", "line": 3, "tottime_s": 1.0, "cumtime_s": 1.0,
                            "ncalls": 10}]
        hs["lines"] = [{"file": "/dev/zero", "line": 3, "samples": 100}]
        (run / name).write_text(json.dumps(hs))
        reported(*cli(tmp_path, monkeypatch, capsys, "report", run, "--format", "json"))
        return
    else:
        (run / name).write_text(json.dumps(value))
    error_line(*cli(tmp_path, monkeypatch, capsys, "report", run), name)
    if name in ("meta.json", "steps.json"):  # what the gate reads of a run folder
        error_line(*cli(tmp_path, monkeypatch, capsys, "compare", run, run), name)


def test_a_run_that_names_a_device_as_its_script_is_not_hashed_forever(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(GOLDEN_RUN, run)
    meta = json.loads((run / "meta.json").read_text())
    meta["script"] = "/dev/zero"
    meta["user_files"] = ["/dev/zero", "/dev/urandom"]
    (run / "meta.json").write_text(json.dumps(meta))
    code, out, err = cli(tmp_path, monkeypatch, capsys, "compare", run, run, "--format", "json")
    assert code == 0, err
    reported(*cli(tmp_path, monkeypatch, capsys, "report", run, "--format", "json"))
