"""What `perfdoctor run` leaves alone in the user's process (issue 26): a script that forks, trains on
several threads, handles SIGTERM, sets its own profile hook or profiler, exits with an odd code,
has a non-UTF-8 or very long name; and `-m` naming no module.

The tests that run a real script under `perfdoctor run` are marked e2e (a few seconds each); the
others are fast."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from perfdoctor.capture import runner
from perfdoctor.capture.child import _exit_code
from perfdoctor.contracts.run import Exit, Meta, decode, encode
from tests.cli.test_run_robustness import _env, script  # one tiny training loop and environment for both
from tests.helpers import run_cli


def _meta(run_dir: Path) -> dict:
    return json.loads((run_dir / "meta.json").read_text())


# -- fast ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "status"), [(0, 0), (3, 3), (256, 0), (257, 1), (-1, 255), (None, 0), (True, 1)])
def test_exit_code_is_the_status_the_shell_sees(code, status) -> None:
    assert _exit_code(SystemExit(code)) == status


def test_run_files_hold_non_utf8_names_as_escaped_bytes() -> None:
    name = os.fsdecode(b"/tmp/tr\xe9in.py")  # what Python makes of a Latin-1 file name: a lone surrogate
    meta = Meta(script=name, argv=[name, os.fsdecode(b"a\xff")], cwd=os.fsdecode(b"/tmp/d\xe9r"), exit=Exit(code=0))
    back = decode(encode(meta), Meta, Path("meta.json"))
    assert (back.script, back.argv[1], back.cwd) == ("/tmp/tr\\xe9in.py", "a\\xff", "/tmp/d\\xe9r")


def test_a_very_long_script_name_gets_a_run_folder_that_fits(tmp_path: Path) -> None:
    for stem in ("x" * 250, "é" * 200):
        d = runner.new_run_dir(f"{stem}.py", False, None, base=tmp_path)
        assert d.is_dir() and len(os.fsencode(d.name)) <= 255 - len("-999")
        assert d.name.startswith(stem[:100])


@pytest.mark.skipif(not hasattr(signal, "sigtimedwait"), reason="POSIX signals")
@pytest.mark.parametrize("group", [True, False])
def test_a_signal_reaches_the_child_once_and_as_it_was_sent(tmp_path: Path, group: bool) -> None:
    """SIGTERM to the whole process group (GNU timeout, SLURM) is not sent again; SIGTERM to perfdoctor
    alone is passed on as SIGTERM, never as SIGINT. The child here reports what it receives as
    perfdoctor's child does (signal.set_wakeup_fd on the pipe)."""
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent("""
        import os, signal, sys, time
        fd = int(sys.argv[1]); os.set_blocking(fd, False); signal.set_wakeup_fd(fd)
        got = []
        def note(sig, _f):
            got.append(signal.Signals(sig).name)
            if sig == signal.SIGTERM:
                time.sleep(1.0)  # saving a checkpoint: a second signal would land in it
                print(" ".join(got), flush=True); sys.exit(0)
        signal.signal(signal.SIGTERM, note); signal.signal(signal.SIGINT, note)
        print("ready", flush=True)
        while True:
            time.sleep(0.01)
    """))
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        import os, subprocess, sys, time
        from perfdoctor.capture import runner
        r, w = os.pipe(); os.set_blocking(r, False)
        proc = subprocess.Popen([sys.executable, {str(child)!r}, str(w)], pass_fds=(w,), stdout=subprocess.PIPE, text=True)
        os.close(w)
        assert proc.stdout.readline().strip() == "ready"
        print("waiting", flush=True)
        n = runner._wait(proc, lambda: None, lambda: None, r)
        print("CHILD", proc.stdout.read().strip(), "CODE", proc.returncode, "RECEIVED", n, flush=True)
    """))
    p = subprocess.Popen([sys.executable, str(driver)], env=_env(), stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "waiting"
    time.sleep(0.3)  # in the wait loop, the signals blocked
    if group:
        os.killpg(p.pid, signal.SIGTERM)
    else:
        os.kill(p.pid, signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    assert "CHILD SIGTERM CODE 0 RECEIVED 1" in out, out


# -- e2e: real scripts under perfdoctor ---------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_script_that_forks_helpers_that_sys_exit(tmp_path: Path) -> None:
    """Helpers forked before, inside and after the profiled window end with sys.exit: each ends at
    once with its own code and atexit functions, and none of them writes the run folder. Each runs
    bare: the probes' wrappers of torch's functions are off in the copy, on in the script."""
    script(tmp_path, "train.py", """
        import atexit
        def wrapped():
            fns = (torch.Tensor.item, torch.Tensor.__bool__, torch.nn.Module.__call__, torch.autograd.backward,
                   torch.utils.data.dataloader._BaseDataLoaderIter.__next__)
            return sum(hasattr(f, "__wrapped__") for f in fns)
        codes = []
        for i in range(20):
            step()
            if i in (2, 8, 15):
                pid = os.fork()
                if pid == 0:
                    atexit.register(lambda: print("helper atexit", flush=True))
                    # and the Tensor methods the host-tensor probe wraps while it watches the first steps
                    print("helper wrapped", wrapped() + hasattr(torch.Tensor.to, "__wrapped__")
                          + hasattr(torch.Tensor.__getitem__, "__wrapped__"), flush=True)
                    step()
                    sys.exit(7)
                codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        print("codes", codes, "script wrapped", wrapped())
    """)
    p = run_cli("run", "train.py", "--out-dir", "run", "-f", "json", cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "codes [7, 7, 7] script wrapped 5" in p.stderr and p.stderr.count("helper atexit") == 3
    assert p.stderr.count("helper wrapped 0") == 3
    meta = _meta(tmp_path / "run")
    assert (meta["exit"]["code"], meta["exit"]["reason"]) == (0, "completed")
    assert json.loads((tmp_path / "run" / "steps.json").read_text())["steps"][-1]["i"] == 20
    assert meta["window"]["trace"]


@pytest.mark.e2e
def test_three_threads_that_each_train(tmp_path: Path) -> None:
    """The clock follows one training thread and the profiler starts and stops on it (kineto aborts
    the process when another thread steps it)."""
    script(tmp_path, "train.py", """
        import threading
        def train():
            m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
            for i in range(30):
                loss = m(torch.randn(4, 8)).sum(); opt.zero_grad(); loss.backward(); opt.step()
        ts = [threading.Thread(target=train) for _ in range(3)]
        [t.start() for t in ts]; [t.join() for t in ts]
        print("trained")
    """)
    p = run_cli("run", "train.py", "--out-dir", "run", "-f", "json", cwd=tmp_path, timeout=120)  # crashed 3 runs in 4
    assert p.returncode == 0 and "trained" in p.stderr, p.stderr[-3000:]
    meta = _meta(tmp_path / "run")
    assert meta["exit"]["reason"] == "completed" and meta["window"]["completed"]
    assert len(json.loads((tmp_path / "run" / "steps.json").read_text())["steps"]) == 30


@pytest.mark.e2e
@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("group", [True, False])
def test_sigterm_runs_the_scripts_own_handler_once(tmp_path: Path, group: bool) -> None:
    """A preemption handler saves its checkpoint and exits 0, whether SIGTERM went to the whole process
    group (GNU timeout, SLURM) or to perfdoctor alone: no KeyboardInterrupt, perfdoctor exits 0."""
    script(tmp_path, "train.py", """
        import signal
        def on_term(sig, frame):
            torch.save(m.state_dict(), "ckpt.pt"); print("saved", flush=True); sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        while True:
            step(); time.sleep(0.01)
    """)
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "perfdoctor", "run", "train.py", "--out-dir", str(out)],
                         cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    partial = out / "steps.partial.jsonl"
    t = time.time()
    while not (partial.exists() and partial.read_bytes().count(b'"i"') >= 3):
        assert time.time() - t < 90 and p.poll() is None, "the script did not start"
        time.sleep(0.1)
    if group:
        os.killpg(p.pid, signal.SIGTERM)
    else:
        p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=90)
    assert p.returncode == 0, stderr[-3000:]
    assert (stdout + stderr).splitlines().count("saved") == 1 and "KeyboardInterrupt" not in stderr
    assert (tmp_path / "ckpt.pt").exists()
    assert _meta(out)["exit"]["code"] == 0


@pytest.mark.e2e
def test_the_scripts_own_profile_hook_and_legacy_profiler_are_left_alone(tmp_path: Path) -> None:
    script(tmp_path, "train.py", """
        n = 0
        def hook(frame, event, arg):
            global n
            if event == "call" and frame.f_code.co_name == "step" and frame.f_code.co_filename == __file__:
                n += 1
        sys.setprofile(hook)
        for i in range(20):
            if i == 14:
                with torch.autograd.profiler_legacy.profile():
                    step()
            else:
                step()
        sys.setprofile(None)
        print("calls", n)
    """)
    p = run_cli("run", "train.py", "--out-dir", "run", "-f", "json", cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "calls 20" in p.stderr
    window = _meta(tmp_path / "run")["window"]
    assert window["user_profile_hook"] and window["trace"]


@pytest.mark.e2e
@pytest.mark.skipif(sys.platform != "linux", reason="file names of any bytes")
def test_non_utf8_script_name_argument_and_folder_and_exit_256(tmp_path: Path) -> None:
    """The script runs (Python's surrogateescape throughout); `sys.exit(256)` is 0, as the shell sees it."""
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/d\xe9r"))
    folder.mkdir()
    name = os.fsdecode(b"tr\xe9in.py")
    script(folder, name, """
        step()
        print("args", [os.fsencode(a) for a in sys.argv[1:]], os.fsencode(os.getcwd()).endswith(b"\\xe9r"))
        sys.exit(256)
    """)
    env = _env()
    p = subprocess.run([os.fsencode(sys.executable), b"-m", b"perfdoctor", b"run", b"-f", b"json", b"tr\xe9in.py",
                        b"a\xff"], cwd=folder, env=env, capture_output=True, timeout=120)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 0, err[-3000:]
    assert "args [b'a\\xff'] True" in err and "Traceback" not in err
    report = json.loads(p.stdout)
    assert report["run"]["exit"]["code"] == 0


@pytest.mark.e2e
def test_run_of_a_module_that_does_not_exist_is_one_error(tmp_path: Path) -> None:
    p = run_cli("run", "-m", "no_such_module_here", cwd=tmp_path, timeout=120)
    assert p.returncode == 3
    lines = [line for line in p.stderr.splitlines() if line.strip() and not line.startswith("perfdoctor: running ")]
    assert lines == ["perfdoctor: error: no_such_module_here did not start: No module named no_such_module_here"]
    assert "step" not in p.stdout
