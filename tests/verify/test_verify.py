"""`perfdoctor verify` (perfdoctor/verify.py): the verdict from measured series, the loss check, what a
finding changes (its fix, an ablation, nothing), the patch `git apply` takes, the reports; and, end to
end, verify on a sample: the user's files unchanged, a fix that breaks the script reported as
did-not-hold."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfdoctor import verify
from perfdoctor.capture.writer import write, write_meta
from perfdoctor.contracts.report import RunInfoDoc, StepTimeDoc, SummaryDoc
from perfdoctor.contracts.run import SCHEMA, Meta, Rank, Step, Steps, rank_dirs
from perfdoctor.errors import InputError
from perfdoctor.model import Finding, Fix, Location, Report, Verification
from perfdoctor.report.formats import FORMATS, render
from perfdoctor.rules.catalog import load_rules
from perfdoctor.rules.engine import PROJECTED
from perfdoctor.rules.fixes import render_fix
from perfdoctor.stats import warmup_steps
from tests.helpers import REPO, SAMPLES, TERMINAL_JOB, run_cli

SERIES = json.loads((REPO / "tests" / "data" / "verify" / "pd027_gc_series.json").read_text())


# -- the verdict -------------------------------------------------------------------------------------
def test_verdicts_from_the_interval() -> None:
    assert verify.verdict(30.0, 31.0, 25.0, 36.0)[0] == "verified"
    assert verify.verdict(60.0, 31.0, 25.0, 36.0)[0] == "smaller"
    assert verify.verdict(10.0, 31.0, 25.0, 36.0)[0] == "larger"
    assert verify.verdict(30.0, 2.0, -5.0, 9.0)[0] == "no-saving-here"
    assert verify.verdict(None, 31.0, 25.0, 36.0)[0] == "verified"
    slower, why = verify.verdict(30.0, -20.0, -26.0, -14.0)
    assert slower == "smaller" and "slower" in why


def test_a_recorded_fix_is_a_real_saving() -> None:
    """PD027's gc.collect() removed, three runs a side under heavy load (the original's runs 546-768 ms
    per step): a real saving (the interval clears zero) whose interval holds the spread of the
    original's runs as well as the fixed copy's, and the prediction inside it."""
    base, point, lo, hi = verify.saving_interval(SERIES["original"], SERIES["fixed"])
    assert 0 < lo < point < hi < base
    assert hi - lo > 0.2 * point  # both sides' uncertainty, not the ratio's scaled by a known original
    assert verify.verdict(SERIES["predicted_ms"], point, lo, hi)[0] == "verified"
    assert verify.verdict(2 * SERIES["predicted_ms"], point, lo, hi)[0] == "smaller"
    assert verify.settled(SERIES["predicted_ms"], base, lo, hi)


def test_runs_of_the_same_script_show_no_saving() -> None:
    """The original against itself (its first run against its other two): no saving, and a predicted one
    inside the interval leaves it undecided (verify adds runs)."""
    original = SERIES["original"]
    base, point, lo, hi = verify.saving_interval(original[:1] + original[2:], original[1:2])
    assert lo < 0 < hi
    assert verify.verdict(None, point, lo, hi)[0] == "no-saving-here"
    assert not verify.settled((lo + hi) / 2 if (lo + hi) / 2 > 0 else hi / 2, base, lo, hi)


def test_loss_check() -> None:
    seeded = [[2.3, 2.1, 1.9], [2.3, 2.1, 1.9]]
    assert verify.loss_check(seeded, [[2.3, 2.1, 1.9]]) is None
    assert verify.loss_check(seeded, [[2.3, 2.1, 1.905]]) is None  # within LOSS_RTOL: autocast's rounding
    why = verify.loss_check(seeded, [[2.3, 2.8, 3.5]])
    assert why is not None and "step 2" in why
    assert verify.loss_check(seeded, [[2.3, None, 1.9]]) is not None  # the loss became NaN
    assert verify.loss_check([[2.3, 2.1], [2.4, 2.0]], [[9.0, 9.0]]) is None  # not seeded: nothing to hold it to


# -- what a finding changes ------------------------------------------------------------------------------
def _finding(rule: str, loc: Location, fix: Fix | None = None, ms: float | None = 5.0) -> Finding:
    return Finding(rule, "x", "high", "t", "m", "w", ms, None, "measured", "high", [loc], fix=fix)


def _loc(path: Path, needle: str) -> Location:
    n, line = next((n, l) for n, l in enumerate(path.read_text().splitlines(), 1) if needle in l)
    return Location(str(path), n, line.strip())


def test_plans(tmp_path: Path) -> None:
    rules = {r.id: r for r in load_rules()}
    gc = tmp_path / "gc.py"
    shutil.copy(SAMPLES / "pd027_gc_in_loop.py", gc)
    loc = _loc(gc, "gc.collect()  #")
    fix = render_fix("remove-call", loc, {"callee": "gc.collect"})  # PD027's fix, as the rule renders it
    assert fix is not None
    change = verify.plan(_finding("PD027", loc, fix), rules["PD027"], False)
    assert isinstance(change, verify.Change) and change.kind == "fix"
    assert "gc.collect()  #" not in change.files[gc] and "import gc" in change.files[gc]
    stale = verify.plan(_finding("PD027", loc, Fix("gc.collect(generation=2)", "")), rules["PD027"], False)
    assert isinstance(stale, Verification) and stale.verdict == "did-not-hold"
    # a GPU-only finding on a CPU run of a CUDA-targeting script
    gpu = verify.plan(_finding("PD005", loc, fix), rules["PD005"], True)
    assert isinstance(gpu, Verification) and gpu.verdict == "not-verifiable-here" and "GPU" in gpu.why
    # no mechanical fix: PD013's ablation takes set_detect_anomaly(True) out
    anomaly = tmp_path / "anomaly.py"
    shutil.copy(SAMPLES / "pd013_anomaly_detection.py", anomaly)
    aloc = _loc(anomaly, "torch.autograd.set_detect_anomaly(True)")
    ablation = verify.plan(_finding("PD013", aloc, Fix("a", "b", example=True), None), rules["PD013"], False)
    assert isinstance(ablation, verify.Change) and ablation.kind == "ablation"
    assert "torch.autograd.set_detect_anomaly(True)" not in ablation.files[anomaly]
    compile(ablation.files[anomaly], str(anomaly), "exec")
    data = verify.plan(_finding("PD014", aloc, None), rules["PD014"], False)
    assert isinstance(data, verify.Change) and data.ablate == "data"
    assert ablation.statistic == "median"  # paid on every step
    # PD020's periodic stall: the stalling call skipped, judged on the mean step (its saving is on some steps only)
    stall = tmp_path / "stall.py"
    shutil.copy(SAMPLES / "pd020_periodic_stall.py", stall)
    sloc = _loc(stall, "save_checkpoint(model, optimizer, ckpt)  #")
    skipped = verify.plan(_finding("PD020", sloc, Fix("a", "b", example=True)), rules["PD020"], False)
    assert isinstance(skipped, verify.Change) and skipped.kind == "ablation" and skipped.statistic == "mean"
    assert "save_checkpoint(model, optimizer, ckpt)  #" not in skipped.files[stall]
    compile(skipped.files[stall], str(stall), "exec")
    nothing = verify.plan(_finding("PD012", aloc, None), rules["PD012"], False)
    assert isinstance(nothing, Verification) and nothing.verdict == "not-verifiable-here"
    # a fix in words (the value comes from a variable set elsewhere): nothing to apply, not a fix that broke
    words = verify.plan(_finding("PD018", loc, Fix("", "", "num_workers comes from `workers`: give it 2")),
                        rules["PD018"], False)
    assert isinstance(words, Verification) and words.verdict == "not-verifiable-here" and "words" in words.why
    # PD002 projected for the GPU a CPU run's script targets: that GPU's saving, not this CPU's step
    projected = _finding("PD002", loc, fix)
    projected.saving_basis = f"{PROJECTED}; from what was measured in this run"
    off = verify.plan(projected, rules["PD002"], True)
    assert isinstance(off, Verification) and off.verdict == "not-verifiable-here" and "projected" in off.why
    assert isinstance(verify.plan(projected, rules["PD002"], False), verify.Change)  # a GPU run: measured there


def test_the_patch_applies_with_git(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    script = proj / "train.py"
    shutil.copy(SAMPLES / "pd027_gc_in_loop.py", script)
    loc = _loc(script, "gc.collect()  #")
    f = _finding("PD027", loc, render_fix("remove-call", loc, {"callee": "gc.collect"}))
    change = verify.plan(f, None, False)
    assert isinstance(change, verify.Change)
    project = verify.Project(root=proj, script=script, module=None, cwd=proj, args=[])
    patch = verify.diff(project, [change])
    assert patch.startswith("--- a/train.py\n+++ b/train.py\n")
    copy = tmp_path / "copy"
    shutil.copytree(proj, copy)
    (tmp_path / "p.diff").write_text(patch)
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
    subprocess.run(["git", "apply", str(tmp_path / "p.diff")], cwd=copy, check=True)
    assert (copy / "train.py").read_text() == change.files[script]


def test_every_format_shows_the_verdict() -> None:
    f = _finding("PD027", Location("/x/train.py", 3, "gc.collect()"), Fix("gc.collect()", ""), ms=30.0)
    f.verification = Verification("smaller", "fix", "a real saving, smaller than the predicted 30.0 ms", 20.0,
                                  (15.0, 25.0), 6, 100.0)
    report = Report(run=RunInfoDoc(script="/x/train.py"), summary=SummaryDoc(step_time_ms=StepTimeDoc(median=100.0)),
                    findings=[f])
    for fmt in FORMATS:
        doc = render(fmt, report)
        if FORMATS[fmt].console:
            from rich.console import Console

            console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
            console.print(doc)
            doc = console.export_text()
        assert "smaller" in doc, fmt
    out = json.loads(render("json", report))
    assert out["findings"][0]["verification"]["interval_ms"] == [15.0, 25.0]
    sarif = json.loads(render("sarif", report))
    assert sarif["runs"][0]["results"][0]["properties"]["verification"]["verdict"] == "smaller"
    from perfdoctor.model import from_doc, to_doc

    v = f.verification
    assert from_doc(to_doc(report)).findings[0].verification == v  # `report report.json` keeps it
    f.verification = None
    assert "verification" not in render("json", report)  # reports without verify are as they were
    f.verification = v
    page = render("html", report)
    assert "predicted 30.0 ms" in page.replace("&nbsp;", " ") or "predicted" in page
    assert page.count("savebar") >= 2  # the prediction's bar and the verified bar with both numbers


# -- end to end ---------------------------------------------------------------------------------------
# A small copy of PD027's sample (14 steps, a small heap for gc.collect() to walk): a run costs about its
# start-up, so that the three tests below make about 17 runs between them.
GC_TRAIN = REPO / "tests" / "data" / "verify" / "gc_train.py"


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and ".perfdoctor" not in p.parts and "run" not in p.parts}


def _project(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    proj = tmp_path / "proj"
    proj.mkdir()
    script = proj / "train.py"
    shutil.copy(GC_TRAIN, script)
    (proj / "data.txt").write_text("the user's data\n")
    return proj, script, _hashes(proj)


@pytest.mark.e2e
def test_run_verify_end_to_end(tmp_path: Path) -> None:
    """`run --verify --write-patch`: a verdict with a real saving for PD027's fix in the JSON, the gate's
    3 runs a side at least, the user's files unchanged (hashed before and after), no copy of the
    project left behind, and a patch `git apply` takes."""
    proj, script, before = _project(tmp_path)
    patch = tmp_path / "fixes.diff"
    p = run_cli("run", str(script), "--verify", "--steps", "12", "--format", "json", "--out-dir", str(proj / "run"),
                "--write-patch", str(patch), cwd=proj, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "verifying PD027 1/1: run 2 of 6" in p.stderr
    doc = json.loads(p.stdout)
    (gc,) = [f for f in doc["findings"] if f["rule"] == "PD027"]
    v = gc["verification"]
    assert v["kind"] == "fix" and 6 <= v["runs"] <= 12 and v["verdict"] in ("verified", "smaller", "larger")
    assert v["interval_ms"][0] > 0 and v["measured_ms_per_step"] > 0
    assert _hashes(proj) == before
    scratch = proj / "run" / "verify"
    assert (scratch / "01-PD027" / "original-1").is_dir()
    assert not list(scratch.glob("*/project")) and not (scratch / "original").exists()
    copy = tmp_path / "copy"
    shutil.copytree(proj, copy, ignore=shutil.ignore_patterns("run"))
    subprocess.run(["git", "init", "-q"], cwd=copy, check=True)
    subprocess.run(["git", "apply", str(patch)], cwd=copy, check=True)
    assert "gc.collect()  #" not in (copy / "train.py").read_text()


@pytest.mark.e2e
def test_verify_ctrl_c_keeps_what_was_measured(tmp_path: Path) -> None:
    """`perfdoctor verify SCRIPT`, Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while
    the third run of PD027's fix starts: exit 130, the finding judged on the two runs made and said so,
    the user's files unchanged. Then, on the same run folder, a fix that breaks the training (the
    learning rate 100x) is reported as did-not-hold from its losses, and one that raises from its exit."""
    proj, script, before = _project(tmp_path)
    env = {"OMP_NUM_THREADS": "1", **os.environ, "COLUMNS": "200", "NO_COLOR": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "perfdoctor", "verify", str(script), "--steps", "12", "--format",
                             "json", "--out-dir", str(proj / "run")], cwd=proj, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **TERMINAL_JOB)
    err: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)
            if "verifying PD027 1/1: run 3 of" in line:
                time.sleep(0.5)
                os.killpg(proc.pid, signal.SIGINT)
                break
        out, rest = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stderr = "".join(err) + rest
    assert proc.returncode == 130, stderr[-3000:]
    doc = json.loads(out)
    (gc,) = [f for f in doc["findings"] if f["rule"] == "PD027"]
    v = gc["verification"]
    assert v["runs"] == 2 and "interrupted: judged on the runs made" in v["why"], v
    assert v["measured_ms_per_step"] is not None and v["interval_ms"] is not None
    assert any("verify was interrupted" in n for n in doc["notes"])
    assert _hashes(proj) == before

    from perfdoctor.analysis import analyse_run

    report = analyse_run(proj / "run")
    sgd = _loc(script, "torch.optim.SGD(")
    lr = _finding("PD900", sgd, Fix("    " + sgd.code, "    " + sgd.code.replace("lr=0.02", "lr=2.0")))
    step = _loc(script, "optimizer.step()")
    raises = _finding("PD901", step, Fix("        " + step.code, "        raise RuntimeError('broken fix')"))
    report.findings = [lr, raises]
    out2 = verify.verify(report, proj / "run", load_rules(), steps=12, pairs=2, max_pairs=2,
                         progress=verify.Progress(2, write=lambda s: None))
    assert lr.verification is not None and lr.verification.verdict == "did-not-hold", lr.verification
    assert "loss at step" in lr.verification.why
    assert raises.verification is not None and raises.verification.verdict == "did-not-hold"
    assert "broken fix" in raises.verification.why
    assert out2.patch == ""
    assert _hashes(proj) == before


def test_the_copy_reaches_what_lies_beside_the_project(tmp_path: Path) -> None:
    """pytorch/examples' layout: the script in mnist/, its data in ../data; yunjey's tutorials read
    ../../data. The copy of mnist/ sits beside a link to data/ and below one to the data two levels up
    (the script reads the same files); the script's own folder is copied."""
    top = tmp_path / "repo"
    for d in (tmp_path / "data", top / "data", top / "mnist"):
        d.mkdir(parents=True)
    (tmp_path / "data" / "y.bin").write_bytes(b"2")
    (top / "data" / "x.bin").write_bytes(b"1")
    script = top / "mnist" / "main.py"
    script.write_text("open('../data/x.bin').read()\n")
    project = verify.Project(root=top / "mnist", script=script, module=None, cwd=top / "mnist", args=[])
    side = tmp_path / "scratch" / "original"
    copy = verify.copy_project(project, side, tmp_path / "scratch")
    assert copy == verify.copy_root(project, side) and copy.name == "mnist" and copy.parent.name == "repo"
    assert (copy / "main.py").is_file() and not (copy / "main.py").is_symlink()
    assert (copy.parent / "data").is_symlink() and (copy / ".." / "data" / "x.bin").read_bytes() == b"1"
    assert (copy / ".." / ".." / "data" / "y.bin").read_bytes() == b"2"
    shutil.rmtree(tmp_path / "scratch")
    assert (top / "data" / "x.bin").read_bytes() == b"1" and (tmp_path / "data" / "y.bin").read_bytes() == b"2"


# -- a distributed job ----------------------------------------------------------------------------------
def _rank_meta(rank: int, world: int, local: int) -> Meta:
    return Meta(schema=SCHEMA, script=str(SAMPLES / "pd033_ddp_bucket_view.py"), argv=["pd033_ddp_bucket_view.py"],
                cwd=str(SAMPLES), complete=True, step_clock="optimizer",
                rank=Rank(rank=rank, world_size=world, local_world_size=local))


def test_a_jobs_launch_comes_from_its_ranks_meta() -> None:
    """A rank's meta.json says how many ranks ran on its node: verify launches each run the same way, on
    this machine (--standalone: a free port of its own); a run of one process is run bare; a job of
    several nodes cannot be re-run here (one clear error)."""
    assert verify.launch_of(_rank_meta(0, 2, 2)) == ["--standalone", "--nproc-per-node", "2"]
    assert verify.launch_of(_rank_meta(1, 4, 4)) == ["--standalone", "--nproc-per-node", "4"]
    assert verify.launch_of(Meta(schema=SCHEMA, script="train.py")) is None
    with pytest.raises(InputError, match="2 nodes"):
        verify.launch_of(_rank_meta(0, 4, 2))
    assert verify.project_of(_rank_meta(0, 2, 2)).launch == ["--standalone", "--nproc-per-node", "2"]


def test_a_jobs_steps_are_its_slowest_ranks(tmp_path: Path) -> None:
    """A verify run of a job folder: step i is the slowest rank's step i (as the gate takes a job's
    steps), over the steps every rank recorded, the warm-up left out."""
    job = tmp_path / "job"
    walls = {0: [50.0] + [10.0, 14.0] * 10, 1: [50.0] + [13.0, 11.0] * 10 + [99.0]}  # rank 1: one step more
    for rank, ws in walls.items():
        d = job / f"rank-{rank}"
        d.mkdir(parents=True)
        write_meta(d, _rank_meta(rank, 2, 2))
        write(d / "steps.json", Steps(steps=[Step(i=i, wall_ms=w) for i, w in enumerate(ws, 1)]))
    got = verify.steady(job)
    drop = warmup_steps(21)
    assert got == [[13.0, 14.0][(i - 2) % 2] for i in range(1, 22) if i > drop]
    assert 99.0 not in got and 10.0 not in got and 11.0 not in got


def test_verify_of_a_job_folder_takes_no_launch_options(tmp_path: Path) -> None:
    job = tmp_path / "job"
    for rank in (0, 1):
        (job / f"rank-{rank}").mkdir(parents=True)
        write_meta(job / f"rank-{rank}", _rank_meta(rank, 2, 2))
    p = run_cli("verify", str(job), "--nproc-per-node", "2", timeout=120)
    assert p.returncode == 2 and "verified as it was launched" in p.stderr, p.stderr[-2000:]


@pytest.mark.e2e
def test_verify_a_distributed_jobs_fix(tmp_path: Path) -> None:
    """`perfdoctor verify --nproc-per-node 2 SCRIPT`: the job runs with 2 gloo ranks, and each verify run
    of the original and of the copy with PD033's fix (gradient_as_bucket_view=True) is a 2-rank job too
    (a rank folder per rank); the fix gets a measured verdict; the user's files are unchanged."""
    proj = tmp_path / "proj"
    proj.mkdir()
    script = proj / "train.py"
    shutil.copy(SAMPLES / "pd033_ddp_bucket_view.py", script)
    before = _hashes(proj)
    p = run_cli("verify", "--nproc-per-node", "2", str(script), "--steps", "12", "--repeats", "1", "--max-repeats",
                "1", "--format", "json", "--out-dir", str(proj / "run"), cwd=proj, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["run"]["kind"] == "job"
    (f,) = [f for f in doc["findings"] if f["rule"] == "PD033"]
    v = f["verification"]
    assert v["kind"] == "fix" and v["runs"] == 2, v
    assert v["verdict"] in ("verified", "smaller", "larger", "no-saving-here"), v
    assert v["interval_ms"] is not None and v["step_ms"] > 0
    for side in ("original-1", "changed-1"):
        assert [r for r, _ in rank_dirs(proj / "run" / "verify" / "01-PD033" / side)] == [0, 1], side
    assert _hashes(proj) == before
    assert not list((proj / "run" / "verify").glob("*/project"))


def test_verify_path_takes_a_job_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`perfdoctor verify JOB_FOLDER`: the merged analysis of the ranks is verified, launched as the job
    was (the measuring itself is end to end above), and the job folder's report written again."""
    from perfdoctor import orchestrate

    job = tmp_path / "job"
    for rank in (0, 1):
        d = job / f"rank-{rank}"
        d.mkdir(parents=True)
        write_meta(d, _rank_meta(rank, 2, 2))
        write(d / "steps.json", Steps(steps=[Step(i=i, wall_ms=10.0) for i in range(1, 20)]))
    seen: list[verify.Project] = []

    def measured(report: Report, run_dir: Path, rules: list, **kw: object) -> verify.Outcome:
        seen.append(verify.project_of(verify.meta_and_steps(run_dir)[0]))
        return verify.Outcome([], "", False, [])

    monkeypatch.setattr(verify, "verify", measured)
    report, _ = orchestrate.verify_path(job)
    assert report.run is not None and report.run.kind == "job"
    assert [p.launch for p in seen] == [["--standalone", "--nproc-per-node", "2"]]
    assert (job / "report.json").is_file()
