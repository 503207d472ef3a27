"""`perfdoctor run` when things go wrong around the script: a script that changes directory or
deletes its run folder, two runs on one --out-dir, an unwritable current directory or --output,
perfdoctor killed with -9, a script that ignores SIGTERM; and the status line while it runs.

The tests that run a real script under `perfdoctor run` are marked e2e; the others are fast."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from perfdoctor.capture import runner
from perfdoctor.capture.runner import Progress, _finish_meta, new_run_dir
from perfdoctor.contracts.run import Step
from perfdoctor.errors import InputError
from perfdoctor.orchestrate import check_writable, claim_out_dir
from tests.helpers import REPO, run_cli

LOOP = """
import os, sys, time, torch
torch.set_num_threads(1)
m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
def step():
    loss = m(torch.randn(4, 8)).sum(); opt.zero_grad(); loss.backward(); opt.step()
"""


def script(d: Path, name: str, body: str) -> Path:
    p = d / name
    p.write_text(textwrap.dedent(LOOP).lstrip() + textwrap.dedent(body).lstrip())
    return p


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "NO_COLOR": "1"}


def _one_error_line(p: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-2000:]
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{p.stderr}"
    return lines[0]


def _wait_for(pred, timeout: float = 90) -> None:
    t = time.time()
    while not pred():
        assert time.time() - t < timeout, "timed out"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, only not reaped
    except OSError:
        return False


# -- the status line ---------------------------------------------------------------------------

def _step(i: int, end_s: float) -> Step:
    return Step(i=i, end_s=end_s, wall_ms=1.0)


def test_progress_with_a_steps_limit_gives_rate_and_eta() -> None:
    p = Progress(steps_limit=100, window_end=13)
    assert p.parts() == ["starting"]
    assert p.update(_step(1, 5.0))  # the first step: model building, imports; no rate from it alone
    assert p.parts() == ["step 1/100"]
    assert p.update(_step(11, 6.0)) and not p.update(_step(11, 6.0))
    assert p.parts() == ["step 11/100", "10 steps/s", "ETA 9 s"]


def test_progress_rate_is_recent_and_the_window_end_is_the_eta_without_a_limit() -> None:
    p = Progress(steps_limit=None, window_end=300)
    t = 0.5
    p.update(_step(1, t))
    for i in range(2, 201):
        t += 1.0 if i <= 20 else 0.1  # slow first steps, then 10 steps/s for 18 s
        p.update(_step(i, t))
    assert p.parts() == ["step 200", "10 steps/s", "profiled window ends at step 300, ETA 10 s"]
    p.update(_step(301, t + 10))
    assert len(p.parts()) == 2  # past the window, no end known


def test_progress_restarts_when_a_stronger_clock_takes_over_and_shows_slow_steps_per_second() -> None:
    p = Progress(steps_limit=10, window_end=10)
    p.update(_step(30, 3.0))  # DataLoader batches counted first
    p.update(_step(1, 4.0))  # the optimizer clock took over: its count starts again
    p.update(_step(2, 8.0))
    assert p.parts() == ["step 2/10 (count restarted by a stronger step clock)", "4.0 s/step", "ETA 32 s"]  # never silently


def test_status_line_in_a_log_is_a_plain_line_at_most_every_few_seconds(tmp_path: Path, monkeypatch) -> None:
    partial = tmp_path / "steps.partial.jsonl"
    err = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", err)
    clock = [1000.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    status = runner._Status("train.py", partial, Progress(50, 13))
    with partial.open("w") as f:
        for i in range(1, 50):
            f.write(json.dumps({"i": i, "end_s": i * 0.1, "wall_ms": 100.0}) + "\n")
            f.flush()
            clock[0] += 0.6
            status.poll()
    lines = err.getvalue().splitlines()
    assert 49 * 0.6 // status.LOG_EVERY_S - 1 <= len(lines) <= 49 * 0.6 // status.LOG_EVERY_S
    assert all("\r" not in line and "\x1b" not in line for line in lines)
    assert lines[0].startswith("perfdoctor: running train.py: step ") and "steps/s, ETA " in lines[0]


# -- output paths, checked before anything runs -------------------------------------------------

def test_ctrl_c_while_the_child_interpreter_starts_is_an_interrupt(tmp_path: Path) -> None:
    """CI's first-hour test sent Ctrl-C just as the run began: the child's Python was still importing
    `site` and ended with "Fatal Python error: init_import_site" and exit code 1, which `run` returned.
    An interrupt before the child wrote anything ends as one in the script does: 130, reason interrupted.
    Exit code 1 without a signal stays 1 (a child that failed to start)."""
    meta = _finish_meta(tmp_path / "a", "train.py", False, [], 1, True, 0.1)
    assert meta.exit.code == 130 and meta.exit.reason == "interrupted"
    meta = _finish_meta(tmp_path / "b", "train.py", False, [], 1, False, 0.1)
    assert meta.exit.code == 1 and meta.exit.reason == "killed"


def test_ctrl_c_while_the_child_imports_torch_is_an_interrupt(tmp_path: Path) -> None:
    """CI's first-hour test again: the child had written its first meta.json and was importing torch, which
    turned the KeyboardInterrupt into "TypeError: expected a message argument"; the child died with 1. Before
    torch is imported no script has run: 130, as an interrupt. Once torch is in (the script may be running,
    and may leave with its own 1 from a handler of its own), the script's exit code stands."""
    from perfdoctor.capture.writer import write_meta
    from perfdoctor.contracts.run import SCHEMA, Env, Exit, Meta

    for folder, torch_version, want in (("a", None, 130), ("b", "2.13.0", 1)):
        run_dir = tmp_path / folder
        run_dir.mkdir()
        env = Env() if torch_version is None else Env(torch=torch_version)
        write_meta(run_dir, Meta(schema=SCHEMA, script="train.py", module=None, argv=["train.py"], cwd=str(tmp_path),
                                 started=None, env=env, window=None, step_clock="none",
                                 exit=Exit(code=None, reason="killed", traceback=None), complete=False))
        meta = _finish_meta(run_dir, "train.py", False, [], 1, True, 0.1)
        assert meta.exit.code == want and meta.exit.reason == "interrupted"


def test_check_writable(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a folder"):
        check_writable(tmp_path, "--output")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match=r"--save-baseline .*file/b.json: cannot write it"):
        check_writable(tmp_path / "file" / "b.json", "--save-baseline")
    check_writable(tmp_path / "new" / "r.md", "--output")  # nothing is made: the folder comes with the file
    assert not (tmp_path / "new").exists()
    check_writable(tmp_path / "file", "--output")
    assert (tmp_path / "file").read_text() == "x"  # an existing file is not truncated by the check


def test_unwritable_output_fails_before_running(tmp_path: Path) -> None:
    train = script(tmp_path, "train.py", "for _ in range(3): step()\n")
    (tmp_path / "file").write_text("x")
    for option in ("--output", "--save-baseline"):
        p = run_cli("run", str(train), option, str(tmp_path / "file" / "out.json"), cwd=tmp_path, timeout=60)
        assert p.returncode == 2 and option in _one_error_line(p)
        assert not (tmp_path / ".perfdoctor").exists()  # nothing ran


def test_unwritable_current_directory_is_one_error_line_before_running(tmp_path: Path) -> None:
    train = script(tmp_path, "train.py", "for _ in range(3): step()\n")
    (tmp_path / ".perfdoctor").write_text("")  # the default run folder cannot be made under it
    p = run_cli("run", str(train), cwd=tmp_path, timeout=60)
    assert p.returncode == 2
    line = _one_error_line(p)
    assert "cannot create the run folder" in line and "give --out-dir" in line
    with pytest.raises(InputError, match="cannot create the run folder"):
        new_run_dir("train.py", False, None, base=tmp_path)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_read_only_current_directory(tmp_path: Path) -> None:
    """A folder the user may not write into: one error line saying where to go instead. Root (CI
    runs as root) writes anywhere, so there the check runs in a process without root's power to
    override file permissions (setpriv drops CAP_DAC_OVERRIDE)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    code = ("import sys\nfrom pathlib import Path\nfrom perfdoctor.errors import InputError\n"
            "from perfdoctor.capture.runner import new_run_dir\n"
            "try:\n    new_run_dir('train.py', False, None, base=Path(sys.argv[1]))\n"
            "except InputError as e:\n    print(e.message)\n    sys.exit(0)\nsys.exit(1)\n")
    cmd = [sys.executable, "-c", code, str(ro)]
    if os.geteuid() == 0:
        assert shutil.which("setpriv"), "root needs util-linux's setpriv to test a read-only folder"
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", *cmd]
    try:
        p = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                           timeout=60)
    finally:
        ro.chmod(0o755)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "cannot create the run folder" in p.stdout and "give --out-dir" in p.stdout
    assert not any(ro.iterdir())


# -- --out-dir: absolute, locked, a previous run kept ----------------------------------------------

def test_out_dir_is_made_absolute(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert new_run_dir("train.py", False, Path("rel")) == tmp_path / "rel"
    assert new_run_dir("train.py", False, None).is_absolute()
    with claim_out_dir(Path("claimed")) as d:
        assert d == tmp_path / "claimed" and d.is_dir()


def test_out_dir_with_a_previous_run_is_refused_unless_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "repeat-2").mkdir(parents=True)
    for d in (out, out / "repeat-2"):
        (d / "meta.json").write_text("{}")
        (d / "trace.json.gz").write_text("")
    (out / "notes.txt").write_text("the user's own file")
    with pytest.raises(InputError, match="holds a previous run; give another folder, or --overwrite"):
        with claim_out_dir(out):
            pass
    assert (out / "meta.json").exists()
    with claim_out_dir(out, overwrite=True) as d:
        assert d == out
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # perfdoctor's files only


@pytest.mark.skipif(os.name != "posix", reason="flock")
def test_out_dir_is_locked_while_a_run_writes_there(tmp_path: Path) -> None:
    with claim_out_dir(tmp_path / "out"):
        with pytest.raises(InputError, match="another perfdoctor run is writing there"):
            with claim_out_dir(tmp_path / "out", overwrite=True):
                pass
    with claim_out_dir(tmp_path / "out"):  # released at the end
        pass


# -- the child and its processes -----------------------------------------------------------------

@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_kill_tree_kills_the_processes_under_the_child() -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"])
    _wait_for(lambda: len(runner._descendants(proc.pid)) == 2, timeout=10)
    below = runner._descendants(proc.pid)
    runner._kill_tree(proc)
    proc.wait(timeout=10)
    _wait_for(lambda: not any(_alive(p) for p in below), timeout=10)


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_child_whose_parent_is_already_gone_exits_at_once() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that has ended (and was reaped)
    code = f"from perfdoctor.capture.child import die_with_parent; die_with_parent({gone.pid}); print('still here')"
    p = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 128 + signal.SIGKILL and "still here" not in p.stdout


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("wrapper", [False, True])
def test_child_dies_with_its_parent(wrapper: bool) -> None:
    # parent: starts the "child" (die_with_parent, then sleeps), prints its pid, then is killed with -9;
    # with a wrapper, a shell forks the child: its parent is the shell, which lives on
    child = ("import os, sys, time; from perfdoctor.capture.child import die_with_parent; "
             "print(os.getpid(), die_with_parent(int(sys.argv[1])), flush=True); time.sleep(60)")
    start = (f"['sh', '-c', '\"$0\" -c \"$1\" \"$2\"; true', sys.executable, {child!r}, str(os.getpid())]"
             if wrapper else f"[sys.executable, '-c', {child!r}, str(os.getpid())]")
    parent = f"import os, subprocess, sys, time; c = subprocess.Popen({start}); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", parent], env=_env(), stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    pid, how = p.stdout.readline().split()
    assert how == ("prctl" if sys.platform.startswith("linux") and not wrapper else "watchdog")
    p.kill()
    p.wait(timeout=10)
    _wait_for(lambda: not _alive(int(pid)), timeout=10)


# -- end to end: real scripts under `perfdoctor run` -----------------------------------------------

@pytest.mark.e2e
def test_relative_out_dir_with_a_script_that_changes_directory(tmp_path: Path) -> None:
    train = script(tmp_path, "train.py", """
        os.chdir(os.path.dirname(os.path.abspath(__file__)) + "/elsewhere")
        for _ in range(16): step()
    """)
    (tmp_path / "elsewhere").mkdir()
    p = run_cli("run", train.name, "--format", "json", "--out-dir", "run", cwd=tmp_path, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["run"]["exit"]["reason"] == "completed" and doc["run"]["steps_observed"] == 16
    assert doc["run"]["run_dir"] == str(tmp_path / "run")
    assert (tmp_path / "run" / "trace.json.gz").is_file() and not (tmp_path / "elsewhere" / "run").exists()


@pytest.mark.e2e
def test_script_that_deletes_its_run_folder(tmp_path: Path) -> None:
    train = script(tmp_path, "train.py", """
        import shutil
        for _ in range(16): step()
        shutil.rmtree(sys.argv[1])
    """)
    out = tmp_path / "run"
    p = run_cli("run", str(train), "--format", "json", "--out-dir", str(out), "--", str(out), cwd=tmp_path,
                timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "the script deleted its run folder" in p.stderr and "Traceback" not in p.stderr
    doc = json.loads(p.stdout)
    assert doc["run"]["exit"]["reason"] == "completed" and doc["run"]["steps_observed"] == 16
    assert json.loads((out / "report.json").read_text())["run"]["steps_observed"] == 16


@pytest.mark.e2e
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG, /proc")
def test_second_run_on_a_busy_out_dir_is_refused_and_kill_9_takes_the_child_along(tmp_path: Path) -> None:
    train = script(tmp_path, "train.py", """
        while True:
            step(); time.sleep(0.01)
    """)
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "perfdoctor", "run", str(train), "--out-dir", str(out)],
                             cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: (out / "steps.partial.jsonl").exists() and b'"i"' in (out / "steps.partial.jsonl").read_bytes())
        second = run_cli("run", str(train), "--out-dir", str(out), "--overwrite", cwd=tmp_path, timeout=60)
        assert second.returncode == 2 and "another perfdoctor run is writing there" in _one_error_line(second)
        children = runner._descendants(first.pid)
        assert children
    finally:
        first.kill()  # kill -9: no chance to clean up
        first.wait(timeout=30)
    _wait_for(lambda: not any(_alive(p) for p in children), timeout=15)


@pytest.mark.e2e
@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_script_that_ignores_signals_gets_them_once_then_sigkill(tmp_path: Path) -> None:
    """SIGTERM to perfdoctor reaches the script as SIGTERM (never as SIGINT), and no timer kills a
    script busy in its SIGTERM handler (a checkpoint being saved); a second SIGTERM kills it. A SIGINT
    first: GRACE_S later one SIGTERM, then SIGKILL."""
    script(tmp_path, "train.py", """
        import signal
        def note(sig, _frame):
            with open("signals.txt", "a") as f:
                f.write(signal.Signals(sig).name + "\\n")
        signal.signal(signal.SIGINT, note)
        signal.signal(signal.SIGTERM, note)
        while True:
            step(); time.sleep(0.01)
    """)
    for first, out in ((signal.SIGTERM, tmp_path / "run"), (signal.SIGINT, tmp_path / "run2")):
        (tmp_path / "signals.txt").unlink(missing_ok=True)
        code = ("from perfdoctor.capture import runner; runner.GRACE_S = 1.0; "
                f"r = runner.run_script('train.py', out_dir={str(out)!r}); print('RESULT', r.exit_code, r.reason)")
        p = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, text=True)
        partial = out / "steps.partial.jsonl"
        _wait_for(lambda partial=partial: partial.exists() and partial.read_bytes().count(b'"i"') >= 3)
        p.send_signal(first)  # SIGTERM: as a CI timeout does
        if first == signal.SIGTERM:
            _wait_for(lambda: (tmp_path / "signals.txt").exists())
            time.sleep(2.5)  # over GRACE_S: still running
            assert p.poll() is None
            p.send_signal(signal.SIGTERM)
        out_text, _ = p.communicate(timeout=60)
        assert "RESULT 137 interrupted" in out_text
        expected = ["SIGTERM"] if first == signal.SIGTERM else ["SIGINT", "SIGTERM"]
        assert (tmp_path / "signals.txt").read_text().split() == expected


@pytest.mark.e2e
def test_status_line_while_running_in_a_log(tmp_path: Path) -> None:
    script(tmp_path, "train.py", """
        for _ in range(60):
            step(); time.sleep(0.05)
    """)
    code = ("from perfdoctor.capture import runner; runner._Status.LOG_EVERY_S = 1.0; "
            f"runner.run_script('train.py', out_dir={str(tmp_path / 'run')!r}, steps=50, show_status=True, "
            "window=(1, 1, 2))")
    t = time.time()
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=180)
    wall = time.time() - t
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [line for line in p.stderr.splitlines() if line.startswith("perfdoctor: running train.py: step ")]
    assert 1 <= len(lines) <= wall + 1, p.stderr
    assert all("/50, " in line and " steps/s, ETA " in line for line in lines[1:]), lines
    assert p.stdout == ""


def test_line_sampler_skips_a_frame_with_no_line_yet(monkeypatch) -> None:
    """A frame seen from the sampler thread between instructions has f_lineno None (3.11+): the
    sample counts, no line None reaches hotspots.json (a CI run once failed on `$.lines[4].line`)."""
    import types

    from perfdoctor.capture import window

    code = types.SimpleNamespace(co_filename=str(REPO / "sample_scripts" / "pd001_clean.py"))
    seen = iter([None, 7, None, 7])
    calls = {"n": 0}

    def frames() -> dict:
        calls["n"] += 1
        try:
            return {1: types.SimpleNamespace(f_code=code, f_lineno=next(seen), f_back=None)}
        except StopIteration:
            sampler.halt.set()
            return {}

    monkeypatch.setattr(window, "is_user_file", lambda path: True)
    monkeypatch.setattr(sys, "_current_frames", frames)
    sampler = window.Sampler(main_ident=1, interval=0.0)
    sampler.run()
    assert sampler.counts == {(code.co_filename, 7): 2}
    assert sampler.samples >= 4


@pytest.mark.e2e
@pytest.mark.parametrize("line,gpu", [("torch.cuda.set_device(0)", True),
                                      ("torch.zeros(1).to('cuda')", True),
                                      ("raise ValueError('no such file: data.csv')", False)])
def test_a_script_that_fails_before_its_first_step_is_no_clean_bill(tmp_path: Path, line: str, gpu: bool) -> None:
    # on this machine (no GPU) a script that asks for CUDA fails at once: nothing is measured, and the
    # report says so, and says why where the error is CUDA's, instead of "no problems found"
    train = script(tmp_path, "train.py", f"""
        {line}
        for _ in range(16): step()
    """)
    p = run_cli("run", str(train), "--out-dir", str(tmp_path / "run"), cwd=tmp_path, timeout=180)
    assert p.returncode == 3, p.stderr[-3000:]
    text = " ".join(p.stdout.split())
    assert "No problems found in the source; the script stopped before its first profiled step, so nothing was " \
           "measured." in text and "No problems found by the rules" not in text
    assert ("the script needs a GPU and this machine has none" in text) is gpu
    md = run_cli("report", str(tmp_path / "run"), "-f", "markdown")
    assert "nothing was measured" in md.stdout and "No findings. ✅" not in md.stdout
