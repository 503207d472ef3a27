"""The command line as a user meets it: commands, exit codes, error lines, run robustness, no torch
where none is needed."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from perfdoctor import __version__
from tests.helpers import REPO, SAMPLES, run_cli

PD_RULES = [f"PD00{i}" for i in range(1, 8)]
KINETO_TRACE = REPO / "tests/data/traces/kineto__resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"


def _one_error_line(p) -> str:
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-2000:]
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{p.stderr}"
    return lines[0]


def _pd(findings: list[dict]) -> list[tuple[str, str, int]]:
    return sorted((f["rule"], Path(l["file"]).name, l["line"]) for f in findings for l in f["locations"]
                  if f["rule"] in PD_RULES)


# -- commands that need no run ------------------------------------------------------------------

def test_version() -> None:
    p = run_cli("--version")
    assert p.returncode == 0, p.stderr
    assert __version__ in p.stdout


def test_rules_lists_every_rule() -> None:
    from perfdoctor.rules.catalog import load_rules

    p = run_cli("rules")
    assert p.returncode == 0, p.stderr
    rules = load_rules()
    assert len(rules) >= 14
    for rule in rules:
        assert re.search(rf"{rule.id}\b.*{re.escape(rule.name)}", p.stdout), f"{rule.id} {rule.name} missing:\n{p.stdout}"


def test_explain_shows_what_why_fix() -> None:
    """Each section of the rule's own documentation, under its heading, in full (the words of the
    rule file, whatever the wrapping; code spans lose their backticks)."""
    from perfdoctor.rules.catalog import find_rule, load_rules

    for name in ("PD005", "dataloader-workers"):
        rule = find_rule(load_rules(), name)
        assert rule is not None
        p = run_cli("explain", name)
        assert p.returncode == 0, p.stderr
        flat = " ".join(p.stdout.split())
        assert flat.startswith(f"{rule.id} {rule.name}") and rule.summary.replace("`", "") in flat
        for heading, body in (("What it does", rule.doc.what), ("Why is this bad?", rule.doc.why),
                              ("Example", rule.doc.example), ("Use instead", rule.doc.use_instead)):
            assert body, (name, heading)
            words = " ".join(body.replace("`", "").split())
            at = flat.find(heading)
            assert at >= 0 and flat.find(words, at) > at, f"{name}: no '{heading}' section with its text:\n{p.stdout}"


def test_explain_unknown_rule_is_one_line_exit_2() -> None:
    p = run_cli("explain", "PD999")
    assert p.returncode == 2
    assert "PD999" in _one_error_line(p)


def _write_bad_input(kind: str, tmp: Path) -> Path:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5}
              for i in range(50)]
    good = json.dumps({"schemaVersion": 1, "traceEvents": events})
    if kind == "missing":
        return tmp / "no_such_trace.json"
    path = tmp / {"corrupt-gzip": "trace.json.gz"}.get(kind, "trace.json")
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated-json":
        path.write_text(good[: len(good) // 2])
    elif kind == "corrupt-gzip":
        path.write_bytes(gzip.compress(good.encode())[:-40] + b"\x00garbage")
    elif kind == "not-a-trace":
        path.write_text(json.dumps({"name": "my-package", "version": "1.0", "dependencies": {}}))
    return path


@pytest.mark.parametrize("kind", ["missing", "empty", "truncated-json", "corrupt-gzip", "not-a-trace"])
def test_report_on_unreadable_input_is_one_line_exit_2(kind: str, tmp_path: Path) -> None:
    path = _write_bad_input(kind, tmp_path)
    p = run_cli("report", str(path))
    assert p.returncode == 2, f"exit {p.returncode}\n{p.stdout[-1000:]}\n{p.stderr[-2000:]}"
    _one_error_line(p)


NO_TORCH = '''
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("test: this command must not import torch")
sys.meta_path.insert(0, _NoTorch())
'''


@pytest.mark.e2e
@pytest.mark.parametrize("args", [["rules"], ["explain", "PD002"], ["report", "{trace}"], ["report", "{run}"]])
def test_commands_without_torch(args: list[str], tmp_path: Path, pd005_run) -> None:
    """`report`, `rules`, `explain` work where `import torch` fails (a sitecustomize forbids it)."""
    (tmp_path / "sitecustomize.py").write_text(NO_TORCH)
    args = [a.format(trace=KINETO_TRACE, run=pd005_run["dir"]) for a in args]
    p = run_cli(*args, env={"PYTHONPATH": f"{tmp_path}:{REPO}"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "must not import torch" not in p.stderr


# -- runs ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pd005_run(tmp_path_factory) -> dict:
    """One text-format run of the empty_cache sample, shared by the tests below."""
    out = tmp_path_factory.mktemp("pd005") / "run"
    p = run_cli("run", str(SAMPLES / "pd005_empty_cache.py"), "--steps", "20", "--out-dir", str(out))
    return {"proc": p, "dir": out}


@pytest.mark.e2e
def test_run_text_report_shows_summary_and_findings(pd005_run) -> None:
    p = pd005_run["proc"]
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert "PD005" in out and "empty_cache" in out, out
    assert "pd005_empty_cache.py" in out, "the finding names no location"
    assert re.search(r"step", out, re.I) and re.search(r"\d+(\.\d+)?\s*ms", out), "no step-time summary"
    assert "{" not in out.splitlines()[0], "text format printed JSON"
    assert (pd005_run["dir"] / "report.json").is_file(), "report.json is always written"


@pytest.mark.e2e
def test_report_on_run_folder_reproduces_findings(pd005_run) -> None:
    saved = json.loads((pd005_run["dir"] / "report.json").read_text())
    assert "PD005" in {f["rule"] for f in saved["findings"]}
    p = run_cli("report", str(pd005_run["dir"]), "--format", "json")
    assert p.returncode == 0, p.stderr[-3000:]
    again = json.loads(p.stdout)
    assert _pd(again["findings"]) == _pd(saved["findings"])
    assert [f["rule"] for f in again["findings"]] == [f["rule"] for f in saved["findings"]]


@pytest.mark.e2e
def test_run_crashing_script_exits_3_and_keeps_report(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = run_cli("run", str(SAMPLES / "crash_midway.py"), "--steps", "50", "--format", "json", "--out-dir", str(out))
    assert p.returncode == 3, f"exit {p.returncode}\n{p.stderr[-3000:]}"
    assert "RuntimeError: simulated failure at step 8" in p.stderr, "the script's traceback is not shown"
    doc = json.loads(p.stdout)  # the report of what was captured is still printed
    assert doc["schema"] == "perfdoctor/report/v1"
    saved = json.loads((out / "report.json").read_text())
    assert saved["findings"] == doc["findings"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["exit"]["reason"] == "exception" and "simulated failure" in meta["exit"]["traceback"]
    assert len(json.loads((out / "steps.json").read_text())["steps"]) == 8


@pytest.mark.e2e
def test_run_script_that_exits_early_is_ok(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = run_cli("run", str(SAMPLES / "exits_early.py"), "--steps", "50", "--format", "json", "--out-dir", str(out))
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-3000:]}"
    doc = json.loads(p.stdout)
    assert doc["summary"]["steps_observed"] == 10
    assert "early stop at step 10" in p.stderr  # with --format json the script's output goes to stderr
    assert json.loads((out / "meta.json").read_text())["exit"]["reason"] == "sys-exit"


@pytest.mark.e2e
def test_run_passes_script_args_and_writes_output_file(tmp_path: Path) -> None:
    out, report = tmp_path / "run", tmp_path / "report.json"
    p = run_cli("run", str(SAMPLES / "needs_args.py"), "--steps", "15", "--format", "json", "--output", str(report),
                "--out-dir", str(out), "--", "--epochs", "3", "--batches-per-epoch", "10")
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-3000:]}"
    assert "epochs=3 epoch 0" in p.stdout + p.stderr
    doc = json.loads(report.read_text())
    assert doc["schema"] == "perfdoctor/report/v1"
    assert doc["summary"]["steps_observed"] == 15  # stopped by --steps inside epoch 1
    assert "perfdoctor/report/v1" not in p.stdout, "--output given: the JSON belongs in the file"
    assert json.loads((out / "meta.json").read_text())["argv"][-4:] == ["--epochs", "3", "--batches-per-epoch", "10"]


@pytest.mark.e2e
def test_run_module(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = run_cli("run", "-m", "pkg_entry", "--steps", "30", "--format", "json", "--out-dir", str(out),
                "--", "--steps-per-epoch", "20", cwd=SAMPLES)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-3000:]}"
    doc = json.loads(p.stdout)
    assert doc["summary"]["steps_observed"] == 20
    assert "pkg_entry: 20 steps" in p.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["module"] == "pkg_entry" and meta["script"] is None


@pytest.mark.e2e
def test_run_script_with_no_optimizer(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = run_cli("run", str(SAMPLES / "no_optimizer.py"), "--format", "json", "--out-dir", str(out))
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-3000:]}"
    doc = json.loads(p.stdout)
    assert not _pd(doc["findings"]), doc["findings"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["step_clock"] != "optimizer"
    assert (out / "report.json").is_file()


def test_run_missing_script_is_one_line_exit_2(tmp_path: Path) -> None:
    p = run_cli("run", str(tmp_path / "nope.py"))
    assert p.returncode == 2
    assert "nope.py" in _one_error_line(p)


def test_report_renders_a_saved_report_json_in_any_format(tmp_path):
    """`perfdoctor report report.json` renders the saved report again (it was refused): the same
    document in JSON, its findings in every other format; a broken one is one line, exit 2."""
    golden = REPO / "tests" / "golden" / "expected" / "pd002_dataloader_workers.json"
    saved = tmp_path / "report.json"
    saved.write_text(golden.read_text())
    p = run_cli("report", str(saved), "--format", "json")
    assert p.returncode == 0, p.stderr
    assert p.stdout == golden.read_text()
    for fmt, seen in (("text", "PD002"), ("markdown", "PD002"), ("sarif", '"ruleId": "PD002"'), ("github", "title=PD002")):
        p = run_cli("report", str(saved), "--format", fmt)
        assert p.returncode == 0 and seen in p.stdout, (fmt, p.stderr)
    out = tmp_path / "again.html"
    assert run_cli("report", str(saved), "--format", "html", "--output", str(out)).returncode == 0
    assert "PD002" in out.read_text()
    saved.write_text(golden.read_text().replace('"summary": {', '"summary": {"surprise": 1, ', 1))
    p = run_cli("report", str(saved))
    assert p.returncode == 2 and "surprise" in p.stderr and len(p.stderr.strip().splitlines()) == 1
