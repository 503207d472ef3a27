"""Issue 25, a user's first hour: the rough edges a new user met, each pinned by a test that failed
before its fix. The scripted walkthrough itself is tests/test_first_hour_e2e.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

from conftest import run_cli
from test_gate import ENV, runs

from perfdoctor.gate.compare import compare


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
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "--rebaseline" not in readme
