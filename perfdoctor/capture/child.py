"""The child process: `python -m perfdoctor.capture.child --run-dir D [--parent-pid P] [--steps N] [--module]
[--job] [--timing] [--ablate KIND] TARGET -- ARGS`.

`--timing`: `perfdoctor verify`'s capture, the step clock alone (capture/recorder.py `timing`).

With `--job` (every rank of a job that `perfdoctor run --nproc-per-node N` launched through
torch.distributed.run), D is the job folder and this rank writes its run folder `D/rank-<RANK>`.

Sets up `sys.argv` and `sys.path` as `python TARGET ARGS` (or `python -m TARGET ARGS`) would,
installs the probes, runs the script as `__main__` (so spawn-started DataLoader workers find
classes defined in it) and always finalises the run folder, whatever way the script ends. It dies
with perfdoctor (`--parent-pid`): a `kill -9` of perfdoctor must not leave the script training on.
"""

from __future__ import annotations

import atexit
import functools
import os
import runpy
import signal
import sys
import threading
import time
import traceback
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from perfdoctor.capture.recorder import Recorder

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the perfdoctor package


def parse_args(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"steps": None, "module": False, "window": None, "parent_pid": None, "job": False,
                            "signal_fd": None, "ablate": None, "timing": False}
    rest = list(argv)
    while rest and rest[0].startswith("--") and rest[0] != "--":
        flag = rest.pop(0)
        if flag == "--run-dir":
            opts["run_dir"] = rest.pop(0)
        elif flag == "--parent-pid":
            opts["parent_pid"] = int(rest.pop(0))
        elif flag == "--steps":
            opts["steps"] = int(rest.pop(0))
        elif flag == "--window":
            opts["window"] = tuple(int(x) for x in rest.pop(0).split(","))
        elif flag == "--module":
            opts["module"] = True
        elif flag == "--signal-fd":
            opts["signal_fd"] = int(rest.pop(0))
        elif flag == "--job":
            opts["job"] = True
        elif flag == "--ablate":
            opts["ablate"] = rest.pop(0)
        elif flag == "--timing":
            opts["timing"] = True
        else:
            raise SystemExit(f"perfdoctor child: unknown option {flag}")
    opts["target"] = rest.pop(0)
    if rest and rest[0] == "--":
        rest.pop(0)
    opts["args"] = rest
    return opts


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process: it exists
        pass
    return True


def die_with_parent(parent_pid: int) -> str:
    """Make this process end when perfdoctor (`parent_pid`) does, however it ends (`kill -9`
    included). Linux: the kernel sends SIGKILL at the parent's death (prctl PR_SET_PDEATHSIG);
    elsewhere, or where the interpreter was started through a wrapper that is our parent instead,
    a daemon thread checks every second. Returns how ("prctl" or "watchdog")."""
    how = "watchdog"
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                how = "prctl"
        except (OSError, AttributeError):  # no libc prctl (a sandbox): the thread does it
            pass
    ppid = os.getppid()
    if ppid != parent_pid and not _exists(parent_pid):  # perfdoctor died before the lines above
        os._exit(128 + signal.SIGKILL)
    if how == "watchdog" or ppid != parent_pid:

        def watch() -> None:
            while os.getppid() == ppid and _exists(parent_pid):
                time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, name="perfdoctor-parent-watchdog", daemon=True).start()
        how = "watchdog"
    return how


def _ours(filename: str) -> bool:
    return (filename in (runpy.__file__, "<frozen runpy>")
            or os.path.abspath(filename).startswith(_HERE + os.sep))


def format_exception(e: BaseException) -> str:
    """The traceback as Python would print it for the script (runpy and perfdoctor frames hidden)."""
    te = traceback.TracebackException(type(e), e, e.__traceback__)
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if not _ours(f.filename)])
    return "".join(te.format())


def exit_status(code: int) -> int:
    """The exit status the shell sees for `sys.exit(code)` / `os._exit(code)`: its low 8 bits
    (`sys.exit(256)` is 0, `sys.exit(-1)` is 255)."""
    return code & 0xFF


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return exit_status(e.code)
    print(e.code, file=sys.stderr)  # sys.exit("message") prints the message and exits 1
    return 1


class NotStarted(ImportError):
    """`-m MODULE` names no module that Python can run (runpy's lookup failed): the script never started."""


def _leave_fork(code: int) -> NoReturn:
    """The script forked (`os.fork()` without exec) and this is the copy, at its end: it ends as Python
    would end it (the `atexit` functions, non-daemon threads joined, stdio flushed), less the C++
    teardown of the profiler's libraries, which hangs in a forked copy (kineto's config loader waits
    for a thread that exists only in the parent). It never writes the run folder: that is the
    process that started the run's (`Recorder` goes inert in a forked copy)."""
    for end in (getattr(threading, "_shutdown", None), getattr(atexit, "_run_exitfuncs", None)):
        try:
            if end is not None:
                end()
        except BaseException:  # noqa: BLE001 - as Python does at exit, errors here do not change the code
            pass
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


def watch_signals(fd: int) -> None:
    """Report every signal this process receives to perfdoctor (`fd`: a pipe's write end), so that it
    passes on only the signals that did not reach the script already (a SIGTERM to the whole process
    group, as GNU timeout and SLURM send, reaches the script once, not twice). The interpreter writes
    the signal's number there itself (`signal.set_wakeup_fd`), whatever handler the script sets.

    A script with no SIGTERM handler of its own gets one that writes the run folder and then ends
    the process by SIGTERM as bare Python would (exit status 143, nothing of the script runs after);
    a handler the script sets later replaces it."""
    try:
        os.set_blocking(fd, False)
        signal.set_wakeup_fd(fd, warn_on_full_buffer=False)
    except (OSError, ValueError):  # not the main thread, or a closed descriptor: perfdoctor forwards blind
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)
        _hide_handler()


def _hide_handler() -> None:
    """The script sees SIGTERM's handler as bare Python has it (SIG_DFL), not perfdoctor's
    `_terminated`: `signal.getsignal` and the previous handler `signal.signal` returns say SIG_DFL
    while `_terminated` is in place (tests/capture/test_differential.py prints the handlers)."""
    real_get, real_set = signal.getsignal, signal.signal

    def getsignal(signalnum: Any) -> Any:
        h = real_get(signalnum)
        return signal.SIG_DFL if h is _terminated else h

    def set_handler(signalnum: Any, handler: Any) -> Any:
        old = real_set(signalnum, handler)
        return signal.SIG_DFL if old is _terminated else old

    for new, real in ((getsignal, real_get), (set_handler, real_set)):
        functools.update_wrapper(new, real)
    signal.getsignal, signal.signal = getsignal, set_handler


_on_sigterm: list[Any] = []  # what _terminated runs before the process ends: the recorder's finalise


def _terminated(sig: int, _frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (the wrapper above, or the real one: the same here)
    for f in _on_sigterm:
        try:
            f()
        except BaseException:  # noqa: BLE001 - the process ends by the signal whatever happens here
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGTERM)


def _finalise(rec: Recorder, run_dir: Path, reason: str, code: int, tb: str | None) -> None:
    """Write the run folder; a script that deleted it gets it back with what perfdoctor still holds
    (steps, probes, meta: the files written before the deletion, the trace among them, are lost).
    A folder that cannot be written is one line: the parent finalises what it can."""
    try:
        if not run_dir.is_dir():
            run_dir.mkdir(parents=True, exist_ok=True)
            print(f"perfdoctor: the script deleted its run folder {run_dir}; written again with what was "
                  "still in memory (the files written before, the trace among them, are lost)", file=sys.stderr)
        rec.finalise(reason, code, tb)
    except OSError as e:
        print(f"perfdoctor: cannot write the run folder {run_dir}: {e.strerror or e}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if opts["parent_pid"] is not None:
        die_with_parent(opts["parent_pid"])
    run_dir = Path(os.path.abspath(opts["run_dir"]))  # the script may change directory
    if opts["job"]:
        from perfdoctor.contracts.run import rank_dir_name, rank_from_env

        job_rank = rank_from_env()
        run_dir = run_dir / rank_dir_name(job_rank.rank if job_rank is not None else 0)
        run_dir.mkdir(parents=True, exist_ok=True)
    target, module = opts["target"], opts["module"]
    script = None if module else os.path.abspath(target)
    if script is None:
        sys.argv = [target, *opts["args"]]
        sys.path[0] = os.getcwd()
    else:
        sys.argv = [target, *opts["args"]]
        sys.path[0] = os.path.dirname(script)

    from perfdoctor.capture import env as envmod
    from perfdoctor.capture.writer import write_meta
    from perfdoctor.contracts.run import SCHEMA, Exit, Meta, rank_from_env

    rank = rank_from_env()
    meta = Meta(schema=SCHEMA, script=script, module=target if module else None, argv=list(sys.argv),
                cwd=os.getcwd(), started=datetime.now().astimezone().isoformat(timespec="seconds"), wall_s=None,
                exit=Exit(code=None, reason="killed", traceback=None), step_clock="none", window=None,
                env=envmod.base_env(), complete=False)
    if rank is not None:
        rank.cpu_share = envmod.cpu_share(meta.env.cpu_count, rank.local_world_size)
        meta.rank = rank
    write_meta(run_dir, meta)

    import torch

    from perfdoctor import usercode
    from perfdoctor.capture import window
    from perfdoctor.capture.clock import StepsReached
    from perfdoctor.capture.recorder import Recorder

    usercode.reset_cache()  # torch is imported now: its folder joins the excluded prefixes
    meta.env.torch = str(torch.__version__)
    write_meta(run_dir, meta)
    distributed = rank is not None and (rank.world_size or 1) > 1
    rec = Recorder(torch, run_dir, meta, steps_limit=opts["steps"],
                   window=window.plan(opts["steps"], opts["window"], distributed), timing=opts["timing"])
    try:
        rec.install()
    except Exception as e:  # noqa: BLE001 - a probe we cannot install must not stop the script
        rec.errors("install", e)
        print(f"perfdoctor: some probes could not be installed ({type(e).__name__}: {e})", file=sys.stderr)

    if opts["ablate"]:  # perfdoctor verify's upper bound (capture/ablation.py); installed last, over the probes
        from perfdoctor.capture import ablation

        ablation.install(torch, opts["ablate"])
    if opts["signal_fd"] is not None:
        watch_signals(opts["signal_fd"])
    _on_sigterm.append(lambda: _finalise(rec, run_dir, "interrupted", 128 + signal.SIGTERM, None))
    pid = os.getpid()
    code, reason, tb = 0, "completed", None
    try:
        if script is None:
            runpy._get_module_details(target, NotStarted)  # type: ignore[attr-defined]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except StepsReached:
        reason = "steps-reached"
    except SystemExit as e:
        code, reason = _exit_code(e), "sys-exit"
    except NotStarted as e:  # perfdoctor says it, in one line (meta.json's traceback holds it)
        code, reason, tb = 1, "not-started", str(e)
    except KeyboardInterrupt as e:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        code, reason, tb = 130, "interrupted", format_exception(e)
        sys.stderr.write(tb)
    except BaseException as e:  # noqa: BLE001 - whatever the script raises, the run folder is written
        code, reason, tb = 1, "exception", format_exception(e)
        sys.stderr.write(tb)
    if os.getpid() != pid:  # a forked copy of the script came back here
        _leave_fork(code)
    if rec.stopping:  # finalised when --steps was reached; the script may have done more after
        code, reason = 0, "steps-reached"
    _finalise(rec, run_dir, reason, code, tb)
    if not (opts["timing"] or opts["job"]) and reason not in ("interrupted", "not-started"):
        _on_sigterm.clear()  # the run folder is final: a SIGTERM now ends the process, as bare Python's
        from perfdoctor.capture.receipt import measure_in_child

        try:
            measure_in_child(run_dir)  # a job's is timed by the parent, once every rank ended
        except Exception:  # noqa: BLE001 - the timing is perfdoctor's; it never changes the script's exit
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
