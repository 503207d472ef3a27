"""`perfdoctor run`, parent side: start the child, watch it, make sure a run folder exists after.

Never imports torch. The script runs in a child process (`python -m perfdoctor.capture.child`),
so its `sys.exit`, crash, `os._exit`, signals and DataLoader workers cannot take perfdoctor down.
The script's stdout/stderr are the child's own file descriptors (inherited, no pipes: orphaned
DataLoader workers that keep them open cannot make us hang).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import msgspec

from perfdoctor.capture.writer import PARTIAL, write, write_meta
from perfdoctor.contracts.run import SCHEMA, ClockLine, Env, Exit, Meta, Step, Steps, decode
from perfdoctor.errors import InputError

_SI_KERNEL = 0x80  # siginfo si_code of a signal the kernel sent (the terminal's Ctrl-C)
RUN_FILES = ("meta.json", "steps.json", "probes.json", "trace.json.gz", "hotspots.json", "profile.pstats",
             "report.json", "steps.partial.jsonl")


@dataclass
class RunResult:
    run_dir: Path
    exit_code: int  # the script's
    reason: str  # completed | steps-reached | sys-exit | exception | interrupted | killed


def new_run_dir(target: str, module: bool, out_dir: Path | None, base: Path | None = None) -> Path:
    """`out_dir` itself (emptied of old run files), else a fresh `.perfdoctor/runs/<stem>-<stamp>[-n]`."""
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        for f in RUN_FILES:
            (out_dir / f).unlink(missing_ok=True)
        return out_dir
    stem = target.rsplit(".", 1)[-1] if module else Path(target).stem
    root = (base or Path.cwd()) / ".perfdoctor" / "runs"
    root.mkdir(parents=True, exist_ok=True)
    name = f"{stem}-{datetime.now():%Y%m%d-%H%M%S}"
    for n in range(1, 1000):
        d = root / (name if n == 1 else f"{name}-{n}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise InputError(f"cannot create a run folder under {root}")


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    pkg_parent = str(Path(__file__).resolve().parents[2])
    if Path(pkg_parent).name not in ("site-packages", "dist-packages"):
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if pkg_parent not in parts:
            env["PYTHONPATH"] = os.pathsep.join(parts + [pkg_parent])
    return env


def _last_step(partial: Path) -> int:
    """The last step the child flushed (it appends one JSON line per step every half second)."""
    try:
        with open(partial, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 512))
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        if line.startswith(b'{"i":'):
            try:
                return msgspec.json.decode(line, type=Step).i
            except msgspec.MsgspecError:  # a line cut short
                continue
    return 0


def _wait(proc: subprocess.Popen, on_poll: Callable[[], None], on_start: Callable[[], None]) -> int:
    """Wait for the child; forward Ctrl-C / SIGTERM to it once. Returns how many we received.

    `on_start` runs once the signals are set up (threads it starts inherit the blocked mask)."""
    received = 0
    since = [0.0]  # when the first signal came

    def forward(sig: int, from_terminal: bool) -> None:
        nonlocal received
        received += 1
        since[0] = since[0] or time.monotonic()
        if received >= 3:
            proc.kill()
        elif received == 2:
            proc.terminate()
        elif not from_terminal and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # the child finalises the run folder on SIGINT

    def escalate() -> None:
        # A child that ignores SIGINT (started with it ignored, or a script's own handler that
        # keeps going) is asked with SIGTERM after 10 s and killed after 20 s.
        if since[0] and proc.poll() is None:
            waited = time.monotonic() - since[0]
            if waited > 20:
                proc.kill()
            elif waited > 10 and received < 2:
                proc.terminate()

    in_main = threading.current_thread() is threading.main_thread()
    sigs = {signal.SIGINT, signal.SIGTERM}
    if in_main and hasattr(signal, "sigtimedwait"):
        # A terminal Ctrl-C reaches the whole foreground process group, child included: forward only
        # what was sent to us alone (kill -INT, a CI timeout's SIGTERM), so the script sees one signal.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
        try:
            on_start()
            while proc.poll() is None:
                info = signal.sigtimedwait(sigs, 0.2)
                if info is not None:
                    forward(info.si_signo, info.si_signo == signal.SIGINT and info.si_code == _SI_KERNEL)
                escalate()
                on_poll()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        return received
    old_handlers = {}
    if in_main:
        for s in sigs:
            old_handlers[s] = signal.signal(s, lambda sig, _f: forward(sig, False))
    try:
        on_start()
        while True:
            try:
                proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                escalate()
                on_poll()
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
    return received


def _read_partial(partial: Path, clock: str) -> tuple[list[Step], str]:
    """The steps the child flushed, and the step clock they count."""
    steps: list[Step] = []
    for line in partial.read_bytes().splitlines():
        try:
            d = msgspec.json.decode(line)
            if "clock" in d:
                clock = msgspec.convert(d, ClockLine).clock or "none"
            elif "i" in d:
                steps.append(msgspec.convert(d, Step))
        except (msgspec.MsgspecError, TypeError):
            continue  # a line cut short when the child died
    return steps, clock


def _finish_meta(run_dir: Path, target: str, module: bool, argv: list[str], code: int, interrupted: bool,
                 wall_s: float) -> Meta:
    """Make sure meta.json and steps.json exist: the child may have died before writing them."""
    meta_path = run_dir / "meta.json"
    try:
        meta = decode(meta_path.read_bytes(), Meta, meta_path)
    except (OSError, InputError):
        meta = Meta(schema=SCHEMA, script=None if module else str(Path(target).resolve()),
                    module=target if module else None, argv=[target, *argv], cwd=os.getcwd(), started=None,
                    env=Env(), window=None, step_clock="none")
    if meta.complete:
        if interrupted and meta.exit.reason in ("completed", "sys-exit", "exception"):
            meta.exit.reason = "interrupted"
            write_meta(run_dir, meta)
        return meta
    partial = run_dir / PARTIAL
    steps: list[Step] = []
    clock = meta.step_clock or "none"
    if partial.exists():
        steps, clock = _read_partial(partial, clock)
        partial.unlink()
    if not (run_dir / "steps.json").exists():
        write(run_dir / "steps.json", Steps(steps=steps))
    meta.wall_s, meta.step_clock, meta.complete, meta.finalised_by = round(wall_s, 4), clock, True, "parent"
    meta.exit = Exit(code=code, reason="interrupted" if interrupted else "killed", traceback=None)
    write_meta(run_dir, meta)
    return meta


def run_script(target: str, *, module: bool = False, script_args: list[str] | tuple[str, ...] = (),
               out_dir: Path | None = None, steps: int | None = None, script_stdout_to_stderr: bool = False,
               show_status: bool = False, window: tuple[int, int, int] | None = None) -> RunResult:
    """Run a training script (or `-m` module) under perfdoctor's capture; return where the run folder is."""
    if not module and not Path(target).is_file():
        raise InputError(f"no such script: {target}")
    if steps is not None and steps < 1:
        raise InputError("--steps must be 1 or more")
    run_dir = new_run_dir(target, module, out_dir)
    cmd = [sys.executable, "-m", "perfdoctor.capture.child", "--run-dir", str(run_dir)]
    if steps:
        cmd += ["--steps", str(steps)]
    if window:
        cmd += ["--window", ",".join(str(int(x)) for x in window)]
    if module:
        cmd.append("--module")
    cmd += [target, "--", *script_args]
    stdout = None
    if script_stdout_to_stderr:
        try:
            stdout = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            stdout = 2
    status = None
    if show_status and sys.stderr.isatty():
        from rich.console import Console

        status = Console(stderr=True).status(f"perfdoctor: running {target}", spinner="dots")
    partial = run_dir / PARTIAL
    last = [0, 0.0]

    def on_poll() -> None:
        if status is None:
            return
        now = time.monotonic()
        if now - last[1] >= 0.5:
            last[1] = now
            n = _last_step(partial)
            if n > last[0]:
                last[0] = n
                status.update(f"perfdoctor: running {target}: step {n}")

    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=_child_env(), stdout=stdout)
    try:
        received = _wait(proc, on_poll, status.start if status is not None else lambda: None)
    finally:
        if status is not None:
            status.stop()
    rc = proc.returncode
    code = rc if rc >= 0 else 128 - rc  # killed by signal N: 128 + N, as a shell reports it
    meta = _finish_meta(run_dir, target, module, list(script_args), code, received > 0, time.monotonic() - t0)
    return RunResult(run_dir=run_dir, exit_code=code if meta.exit.code is None else meta.exit.code,
                     reason=meta.exit.reason or "killed")
