"""The user's folders and files (issue 26): `--out-dir` naming the user's own folder is refused, a bad
option leaves no folder behind, and every reader takes regular files only, without blocking, at most
its cap (a FIFO as a trace, a baseline, a run folder's steps.json, a rule file; a rule file linked to
/dev/zero or to a file outside the project)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from perfdoctor.errors import InputError
from perfdoctor.orchestrate import check_writable, claim_out_dir
from tests.cli.test_hostile_inputs import cli, error_line
from tests.facts.test_run_facts import make_run

posix_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")


def test_out_dir_holding_the_users_own_files_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    mine = tmp_path / "results"
    mine.mkdir()
    for name, text in (("trace.json.gz", "mine"), ("steps.json", "mine"), ("report.html", "mine"), ("notes.txt", "x")):
        (mine / name).write_text(text)
    with pytest.raises(InputError, match="holds files that are not a perfdoctor run"):
        with claim_out_dir(mine, overwrite=True):
            pass
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "report.html", "steps.json", "trace.json.gz"]
    assert all((mine / n).read_text() == "mine" for n in ("trace.json.gz", "steps.json", "report.html"))


def test_an_error_before_the_run_leaves_no_folder_behind(tmp_path: Path) -> None:
    check_writable(tmp_path / "reports" / "ci" / "report.json", "--output")
    assert not (tmp_path / "reports").exists()  # checked, not made
    with pytest.raises(InputError, match="bad setting"):
        with claim_out_dir(tmp_path / "out" / "run"):
            raise InputError("bad setting")  # what run_and_gate raises before the script starts
    assert not (tmp_path / "out").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="cannot write it .* is not a folder"):
        check_writable(tmp_path / "file" / "report.json", "--output")


def test_a_bad_setting_with_output_in_new_folders_leaves_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "bad.toml").write_text("[tool.perfdoctor]\nselect = 3\n")
    code, out, err = cli(tmp_path, monkeypatch, capsys, "run", "train.py", "--output", "reports/ci/report.json",
                         "--out-dir", "runs/one", "--config", "bad.toml")
    error_line(code, out, err, "bad.toml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml", "train.py"]


@posix_only
def test_a_fifo_as_trace_baseline_or_steps_file_is_one_error_line(tmp_path: Path, monkeypatch, capsys) -> None:
    os.mkfifo(tmp_path / "fifo.json")
    error_line(*cli(tmp_path, monkeypatch, capsys, "report", "fifo.json"), "fifo.json")
    error_line(*cli(tmp_path, monkeypatch, capsys, "compare", "fifo.json", "fifo.json"), "fifo.json")
    run = make_run(tmp_path / "run")
    (run / "steps.json").unlink()
    os.mkfifo(run / "steps.json")
    error_line(*cli(tmp_path, monkeypatch, capsys, "report", "run"), "steps.json")


def _project(tmp_path: Path, config: str) -> Path:
    (tmp_path / "perf").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text(config)
    make_run(tmp_path / "run")
    return tmp_path


@posix_only
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "outside"])
def test_a_project_rule_file_that_is_no_regular_file_inside_the_project_is_refused(
        tmp_path: Path, monkeypatch, capsys, kind: str) -> None:
    project = _project(tmp_path / "project", '[tool.perfdoctor]\nextend-rules = ["perf"]\n')
    rule = project / "perf" / "XY100.toml"
    if kind == "fifo":
        os.mkfifo(rule)
    elif kind == "dev-zero":
        rule.symlink_to("/dev/zero")
    else:
        (tmp_path / "elsewhere.toml").write_text("id = 'XY100'\n")
        rule.symlink_to(tmp_path / "elsewhere.toml")
    line = error_line(*cli(project, monkeypatch, capsys, "report", "run", "--config", "pyproject.toml"), "XY100.toml")
    assert ("outside the project" in line) == (kind != "fifo")


@pytest.mark.parametrize(("config", "says"), [
    ('[tool.perfdoctor]\nextend-rules = [""]\n', "extend-rules ''"),
    ("[tool.perfdoctor.thresholds.PD002]\nmax_workers = 1e308\n", "must be a whole number"),
    ("[tool.perfdoctor.thresholds.PD002]\nmax_workers = 4.5\n", "must be a whole number"),
])
def test_settings_that_cannot_be_meant_are_refused(tmp_path: Path, monkeypatch, capsys, config: str, says: str) -> None:
    project = _project(tmp_path, config)
    line = error_line(*cli(project, monkeypatch, capsys, "report", "run", "--config", "pyproject.toml"), "pyproject.toml")
    assert says in line


def test_a_loop_of_symbolic_links_is_its_own_error(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    for args in (("report", "a"), ("compare", "a", "a")):
        assert "a loop of symbolic links" in error_line(*cli(tmp_path, monkeypatch, capsys, *args), "a")
    assert "no such file or folder" in error_line(*cli(tmp_path, monkeypatch, capsys, "report", "c"), "c")


def test_a_failed_jobs_notes_start_with_the_rank_that_failed_first(tmp_path: Path) -> None:
    """Rank 1 raised; rank 0's collective then failed with a secondary gloo error, later: rank 1's
    exception is the first note and the job's exit."""
    from perfdoctor.analysis import analyse_job

    for rank, (err, at) in enumerate((("RuntimeError: [gloo] Connection closed by peer", 200.0),
                                      ("ValueError: the real cause", 100.0))):
        exit_ = {"code": 1, "reason": "exception", "traceback": f"Traceback ...\n{err}\n", "at": at}
        make_run(tmp_path / "job" / f"rank-{rank}", n=20, exit_=exit_)
    report = analyse_job(tmp_path / "job")
    failed = [n for n in report.notes if "the script failed" in n]
    assert "ValueError: the real cause" in failed[0] and "gloo" in failed[1]
    assert report.run.exit.traceback.strip().endswith("ValueError: the real cause")


@pytest.mark.parametrize("odd", [b'"dur": NaN', b'"name": "caf\xe9"', b'"name": "a\\udc80b"'],
                         ids=["nan", "latin-1", "lone-surrogate"])
def test_one_odd_value_in_a_trace_is_repaired_and_named_not_the_whole_trace_refused(
        tmp_path: Path, monkeypatch, capsys, odd: bytes) -> None:
    from tests.cli.test_hostile_inputs import ev, loader_steps, reported

    good = loader_steps("train.py(3): main", n=6)
    marker = ev("MARK", "cpu_op", 5, 7777)
    raw = json.dumps({"traceEvents": [*good, marker]}).encode()
    key = b'"dur": 7777' if odd.startswith(b'"dur"') else b'"name": "MARK"'
    (tmp_path / "t.json").write_bytes(raw.replace(key, odd))
    rep = reported(*cli(tmp_path, monkeypatch, capsys, "report", "t.json", "--format", "json"))
    assert rep["run"]["steps_observed"] == 6
    assert any("not JSON" in n for n in rep["notes"]), rep["notes"]


def test_a_trace_whose_every_timestamp_is_a_string_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    """Each such event is dropped and counted (a string is no time); where that is every event, the
    error says why, not that the trace holds none."""
    from tests.cli.test_hostile_inputs import loader_steps, write_trace

    events = loader_steps("train.py(3): main", n=6)
    for e in events:
        e["ts"] = str(e["ts"])
    write_trace(tmp_path / "t.json", events)
    line = error_line(*cli(tmp_path, monkeypatch, capsys, "report", "t.json"), "t.json")
    assert "none of its events can be used (18 with wrong-typed fields)" in line


def test_implausible_step_times_are_flagged(tmp_path: Path, monkeypatch, capsys) -> None:
    from tests.cli.test_hostile_inputs import ev, reported, write_trace

    events = [ev(f"ProfilerStep#{i}", "user_annotation", i * 9e19, 9e19) for i in range(4)]
    events += [ev("aten::mm", "cpu_op", i * 9e19 + 10, 1000) for i in range(4)]
    write_trace(tmp_path / "t.json", events)
    rep = reported(*cli(tmp_path, monkeypatch, capsys, "report", "t.json", "--format", "json"))
    assert any("steps longer than a day left out" in n for n in rep["notes"]), rep["notes"]


def test_one_truncated_rank_trace_costs_that_rank_not_the_folder(tmp_path: Path, monkeypatch, capsys) -> None:
    from tests.cli.test_hostile_inputs import loader_steps, reported, write_trace

    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for r in (0, 1, 2):
        write_trace(ranks / f"rank{r}.json", loader_steps("train.py(3): main", n=6),
                    distributedInfo={"rank": r, "world_size": 3})
    raw = (ranks / "rank1.json").read_bytes()
    (ranks / "rank1.json").write_bytes(raw[: len(raw) // 2])  # cut off mid-write
    rep = reported(*cli(tmp_path, monkeypatch, capsys, "report", "ranks", "--format", "json"))
    assert any(n.startswith("rank trace rank1.json left out:") for n in rep["notes"]), rep["notes"]
    assert rep["run"]["steps_observed"] == 6


@pytest.mark.parametrize("field", ['message = "{}"'.format("x" * 1_000_000), "evidence = [{}]".format(", ".join(['"step.time_ms"'] * 1000))],
                         ids=["1-MB-text", "1000-entries"])
def test_a_rule_file_whose_text_would_swamp_every_report_is_refused(
        tmp_path: Path, monkeypatch, capsys, field: str) -> None:
    """A 1 MB rule file made 95 MB of Markdown (its text in every finding): a rule's texts and lists
    are bounded, so the reports that repeat them are."""
    project = _project(tmp_path, '[tool.perfdoctor]\nextend-rules = ["perf"]\n')
    (project / "perf" / "XY100.toml").write_text(
        'id = "XY100"\nname = "x"\nseverity = "low"\nsummary = "s"\nwhen = "step.time_ms > 0"\n'
        f'title = "t"\n{field}\n[doc]\nwhat = "w"\nwhy = "y"\n')
    line = error_line(*cli(project, monkeypatch, capsys, "report", "run", "--config", "pyproject.toml"), "XY100.toml")
    assert "over the" in line
