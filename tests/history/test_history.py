"""The run history (perfdoctor/history/): the SQLite store (schema, migration, concurrent writers, a
damaged or foreign file), change points over a script's runs, the view and its renderings, and a gate
baseline made of recorded runs."""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import random
import sqlite3
import subprocess
import sys

import msgspec
import pytest

from perfdoctor.contracts.baseline import RunDoc
from perfdoctor.errors import InputError
from perfdoctor.history import baseline_from_history
from perfdoctor.history.changepoints import pelt, segment
from perfdoctor.history.store import APPLICATION_ID, SCHEMA_VERSION, HistoryRun, Store, resolve_path
from perfdoctor.history.view import build
from perfdoctor.report.history import render_history


def entry(i: int, ms: float, *, script: str = "train.py", env: dict | None = None, branch: str = "main",
          args: list[str] | None = None, kind: str = "run", n_steps: int = 12, seed: int = 0) -> HistoryRun:
    rng = random.Random(seed * 1000 + i)
    steps = [ms * math.exp(rng.gauss(0, 0.01)) for _ in range(n_steps)]
    env = env or {"torch": "2.13.0", "device": "cpu", "cpu_count": 2}
    record = RunDoc(source=f"/runs/{i}", env={**env, "script": script, "args": args or []}, median_ms=ms,
                    step_ms=steps)
    return HistoryRun(key=f"k{i}-{script}", kind=kind, source=f"/runs/{i}", started=f"2026-11-{1 + i // 24:02d}T{i % 24:02d}:00:00",
                      script=f"/p/{script}", script_name=script, args=args or [], env_key=json.dumps(env, sort_keys=True)[:40],
                      env=env, record=record, git_commit=f"{i:040x}", git_branch=branch, git_dirty=False,
                      steps=n_steps, median_ms=ms, gate_ms=ms, exit_code=0,
                      findings=[{"rule": "PD002", "fingerprint": "f", "severity": "high", "title": "t", "file": "x.py",
                                 "line": 3, "saving_ms": 1.5}])


# -- the store -------------------------------------------------------------------------------------

def test_a_new_store_has_the_schema_and_reads_back_what_was_kept(tmp_path):
    path = tmp_path / ".perfdoctor" / "history.sqlite"
    with Store(path) as s:
        assert s.schema_version() == SCHEMA_VERSION
        s.add(entry(1, 50.0))
        s.add(entry(2, 51.0, kind="gate"))
        runs = s.runs(script="train.py")
    assert [r.median_ms for r in runs] == [50.0, 51.0]
    assert runs[1].kind == "gate" and runs[0].findings[0]["rule"] == "PD002"
    assert runs[0].record.step_ms and runs[0].git_branch == "main"
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_run_kept_twice_is_updated_not_doubled_and_a_report_keeps_how_it_was_run(tmp_path):
    with Store(tmp_path / "h.sqlite") as s:
        s.add(entry(1, 50.0, kind="gate"))
        s.add(entry(1, 52.0, kind="report"))
        runs = s.runs()
    assert len(runs) == 1 and runs[0].median_ms == 52.0 and runs[0].kind == "gate"


def test_a_store_from_an_older_schema_is_migrated(tmp_path):
    path = tmp_path / "h.sqlite"
    sqlite3.connect(path).close()  # an empty database: schema version 0
    with Store(path) as s:
        assert s.schema_version() == SCHEMA_VERSION
        s.add(entry(1, 50.0))
        assert len(s.runs()) == 1


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_store_from_a_newer_perfdoctor_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "h.sqlite"
    with Store(path) as s:
        s.add(entry(1, 50.0))
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    before = _digest(path)
    with pytest.raises(InputError, match="newer perfdoctor"):
        Store(path)
    assert _digest(path) == before


@pytest.mark.parametrize("content", [b"this is not a database at all\n" * 100, b"SQLite format 3\x00" + b"\xff" * 4000])
def test_a_damaged_store_is_one_error_and_never_overwritten(tmp_path, content):
    path = tmp_path / "h.sqlite"
    path.write_bytes(content)
    with pytest.raises(InputError, match="history store .*h.sqlite"):
        Store(path)
    assert path.read_bytes() == content


def test_another_programs_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "app.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE users (name TEXT)")
    db.commit()
    db.close()
    before = _digest(path)
    with pytest.raises(InputError, match="not a perfdoctor history store"):
        Store(path)
    assert _digest(path) == before


def test_a_fifo_as_the_store_is_refused_without_blocking(tmp_path):
    path = tmp_path / "h.sqlite"
    os.mkfifo(path)
    with pytest.raises(InputError, match="not a regular file"):
        Store(path)


def _writer(path: str, worker: int, n: int) -> None:
    with Store(path) as s:
        for i in range(n):
            s.add(entry(worker * 1000 + i, 40.0 + worker, script=f"w{worker}.py"))


@pytest.mark.slow
def test_several_processes_writing_at_once_lose_nothing(tmp_path):
    path = str(tmp_path / "h.sqlite")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with Store(path) as s:
        assert len(s.runs()) == 60
        assert sorted(n for _, n in s.scripts()) == [15, 15, 15, 15]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("SELECT count(*) FROM findings").fetchone()[0] == 60


def test_the_store_path_follows_the_option_then_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("PERFDOCTOR_HISTORY", raising=False)
    assert resolve_path(None).name == "history.sqlite"
    assert resolve_path("off") is None
    monkeypatch.setenv("PERFDOCTOR_HISTORY", str(tmp_path / "e.sqlite"))
    assert resolve_path(None) == tmp_path / "e.sqlite"
    assert resolve_path(str(tmp_path / "o.sqlite")) == tmp_path / "o.sqlite"


# -- change points ---------------------------------------------------------------------------------

def test_pelt_finds_the_optimal_split_of_a_clean_step():
    assert pelt([0.0] * 10 + [1.0] * 10, penalty=0.5) == [10]
    assert pelt([0.0] * 20, penalty=0.5) == []


def test_a_step_change_at_run_20_of_30_is_marked_within_two_runs_and_nowhere_else():
    rng = random.Random(7)
    found = 0
    for _ in range(50):
        xs = [50 * math.exp(rng.gauss(0, 0.03)) for _ in range(19)] + [65 * math.exp(rng.gauss(0, 0.03)) for _ in range(11)]
        seg = segment(xs)
        found += len(seg.changes) == 1 and abs(seg.changes[0].index - 19) <= 2
    assert found >= 49


def test_pure_noise_rarely_raises_a_change_and_one_slow_run_is_a_one_off():
    rng = random.Random(3)
    false = sum(bool(segment([50 * math.exp(rng.gauss(0, 0.03)) for _ in range(30)]).changes) for _ in range(300))
    assert false <= 6  # 2 %: measured 0.7 % (changepoints.py)
    xs = [50 * math.exp(rng.gauss(0, 0.02)) for _ in range(30)]
    xs[12] *= 1.6
    seg = segment(xs)
    assert seg.changes == [] and seg.outliers == [12]


# -- the view, its renderings, and the gate's baseline from history -------------------------------

def test_history_names_an_environment_change_at_the_change_point(tmp_path):
    with Store(tmp_path / "h.sqlite") as s:
        for i in range(30):
            env = {"torch": "2.12.0" if i < 20 else "2.13.0", "device": "cpu", "cpu_count": 2}
            s.add(entry(i, 50.0 if i < 20 else 60.0, env=env, seed=i))
        view = build(s, script="train.py")
    assert [c.index for c in view.shifts] == [20]
    assert view.shifts[0].env_changes == ["torch 2.12.0 -> 2.13.0"]
    doc = json.loads(render_history("json", view))
    assert doc["change_points"][0]["run"] == 21 and len(doc["runs"]) == 30
    md = render_history("markdown", view)
    assert "from run 21 of 30 the step is 20% slower" in md and "likely the cause" in md
    page = render_history("html", view)
    assert page.count('class="change"') == 1 and "<svg" in page


def test_history_of_a_script_filters_by_branch_and_lists_scripts_when_none_is_chosen(tmp_path):
    with Store(tmp_path / "h.sqlite") as s:
        for i in range(8):
            s.add(entry(i, 50.0, branch="main" if i % 2 else "feature"))
        s.add(entry(100, 10.0, script="other.py"))
        assert len(build(s, script="train.py", branch="main").runs) == 4
        overview = build(s)
        assert overview.script is None and dict(overview.scripts) == {"train.py": 8, "other.py": 1}
        with pytest.raises(InputError, match="no runs of 'nope.py'"):
            build(s, script="nope.py")


def test_a_gate_baseline_from_history_takes_the_newest_runs_of_the_same_script_args_and_branch(tmp_path):
    path = tmp_path / "h.sqlite"
    with Store(path) as s:
        for i in range(6):
            s.add(entry(i, 50.0 + i, branch="main", args=["--lr", "1"]))
        s.add(entry(50, 99.0, branch="feature", args=["--lr", "1"]))
        s.add(entry(51, 98.0, branch="main", args=["--lr", "2"]))
    base = baseline_from_history(path, "train.py", ["--lr", "1"], runs=3, branch="main")
    assert [r.median_ms for r in base.records] == [53.0, 54.0, 55.0]
    assert base.noise.runs == 3
    with pytest.raises(InputError, match="no completed run"):
        baseline_from_history(path, "train.py", ["--lr", "3"], runs=3, branch="main")


def test_history_command_refuses_formats_it_cannot_write(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(os.getcwd()), os.environ.get("PYTHONPATH")]))}
    with Store(tmp_path / "h.sqlite") as s:
        s.add(entry(1, 50.0))
    out = subprocess.run([sys.executable, "-m", "perfdoctor", "history", "--history", str(tmp_path / "h.sqlite"),
                          "--format", "sarif"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "history is written as text, json, markdown, html" in out.stderr
    out = subprocess.run([sys.executable, "-m", "perfdoctor", "history", "--history", str(tmp_path / "none.sqlite")],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "no such file" in out.stderr and not (tmp_path / "none.sqlite").exists()


# -- end to end: runs kept by `perfdoctor run`, a gate against them --------------------------------

@pytest.mark.e2e
def test_runs_are_kept_and_a_gate_takes_its_baseline_from_them(tmp_path):
    from tests.helpers import REPO, run_cli

    script = str(REPO / "benchmarks" / "steady_train.py")
    store = str(tmp_path / "h.sqlite")

    def env(delay: float) -> dict:
        return {"PERFDOCTOR_BENCH_DELAY_FRACTION": str(delay), "PERFDOCTOR_BENCH_STEPS": "100000"}

    p = run_cli("run", script, "--steps", "40", "--repeats", "2", "--history", store, "--out-dir",
                str(tmp_path / "base"), "-f", "json", env=env(0), cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    h = json.loads(run_cli("history", "--history", store, "-f", "json", cwd=tmp_path).stdout)
    assert h["script"] == "steady_train.py" and [r["kind"] for r in h["runs"]] == ["run", "run"]
    assert all(r["step_ms"] and r["environment"]["cpu_count"] for r in h["runs"])
    # the script made 4x slower per step: the gate against the two recorded runs fails
    g = run_cli("run", script, "--steps", "40", "--history", store, "--history-baseline", "2", "--repeats", "2",
                "--max-repeats", "2", "--max-regression", "40%", "--out-dir", str(tmp_path / "slow"), "-f", "json",
                env=env(3.0), cwd=tmp_path, timeout=300)
    assert g.returncode == 1, g.stderr
    # report of a recorded run folder updates it in the history, never doubles it
    r = run_cli("report", str(tmp_path / "base" / "repeat-1"), "--history", store, "-f", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    h = json.loads(run_cli("history", "--history", store, "-f", "json", cwd=tmp_path).stdout)
    assert [r["kind"] for r in h["runs"]] == ["run", "run", "gate", "gate"]
    assert h["runs"][2]["step_ms"] > 2 * h["runs"][0]["step_ms"]


@pytest.mark.e2e
def test_compare_explains_a_slower_module_and_a_slower_loader(tmp_path):
    """tests/data/scripts/slowed.py run plain, with one more block in its Head module, and with a slow
    dataset: compare names the module (and its matmuls) or the data loading as most of the change."""
    from tests.helpers import REPO, run_cli

    script = str(REPO / "tests" / "data" / "scripts" / "slowed.py")
    for variant in ("plain", "layer", "data"):
        p = run_cli("run", script, "--steps", "40", "--out-dir", str(tmp_path / variant), "--history", "off",
                    "-f", "json", env={"SLOWED": variant}, cwd=tmp_path, timeout=300)
        assert p.returncode == 0, p.stderr
    layer = json.loads(run_cli("compare", str(tmp_path / "plain"), str(tmp_path / "layer"), "-f", "json",
                               cwd=tmp_path).stdout)["explanation"]
    top = layer["modules"][0]
    assert top["name"] == "Net > Head > Sequential > Linear" and top["share"] > 0.5, layer
    assert top["where"].endswith("slowed.py:31")  # Head, the innermost class the script defines
    assert layer["operators"][0]["name"].endswith("in Net > Head > Sequential > Linear"), layer
    data = json.loads(run_cli("compare", str(tmp_path / "plain"), str(tmp_path / "data"), "-f", "json",
                              cwd=tmp_path).stdout)["explanation"]
    assert data["phases"][0]["name"] == "data loading" and data["phases"][0]["share"] > 0.5, data
    text = run_cli("compare", str(tmp_path / "plain"), str(tmp_path / "data"), cwd=tmp_path).stdout
    assert "why it changed:" in text and "by phase: data loading" in text


def test_own_times_subtract_the_intervals_nested_directly_inside():
    from perfdoctor.gate.explain import _own_times

    own = _own_times([(0, 10, 1), (1, 4, 2), (2, 3, 3), (5, 9, 4), (20, 25, 5)])
    assert {i: v for i, (v, _) in own.items()} == {1: 3, 2: 2, 3: 1, 4: 4, 5: 5}
    assert own[3][1] == 2 and own[2][1] == 1 and own[5][1] is None


def test_runs_slowed_by_a_neighbours_load_are_no_change_where_the_cpu_wait_was_measured(tmp_path):
    """Runs 10-19 waited for a CPU (another job on the machine) 40 ms of every 50 ms step; their work was
    the same. With each run's wait known, the history judges the steps less the wait: no change."""
    with Store(tmp_path / "h.sqlite") as s:
        for i in range(30):
            e = entry(i, 90.0 if 10 <= i < 20 else 50.0, seed=i)
            wait = 40.0 if 10 <= i < 20 else 0.5
            e.record = msgspec.structs.replace(e.record, wait_ms=[wait] * len(e.record.step_ms))
            s.add(e)
        view = build(s, script="train.py")
    assert view.statistic.endswith("less the training thread's wait for a CPU")
    assert view.shifts == [] and max(view.values_ms) < 52
    with Store(tmp_path / "w.sqlite") as s:  # the same runs without the wait: the load looks like two changes
        for i in range(30):
            s.add(entry(i, 90.0 if 10 <= i < 20 else 50.0, seed=i))
        assert [c.index for c in build(s, script="train.py").shifts] == [10, 20]


def test_the_store_lives_beside_perfdoctors_own_run_folders(tmp_path, monkeypatch):
    from perfdoctor.cli import _beside_runs, _history_path

    monkeypatch.delenv("PERFDOCTOR_HISTORY", raising=False)
    assert _beside_runs(tmp_path / ".perfdoctor" / "runs" / "train-1") == tmp_path / ".perfdoctor" / "history.sqlite"
    assert _beside_runs(tmp_path / "my-results" / "run") is None  # a folder the user chose: nothing beside it
    assert _history_path(None, None) is None  # --out-dir and nothing asked: no store anywhere
    assert _history_path(str(tmp_path / "h.sqlite"), None) == tmp_path / "h.sqlite"
