"""`perfdoctor run`, parent side: start the child, watch it, make sure a run folder exists after.

Never imports torch. The script runs in a child process (`python -m perfdoctor.capture.child`),
so its `sys.exit`, crash, `os._exit`, signals and DataLoader workers cannot take perfdoctor down.
The script's stdout/stderr are the child's own file descriptors (inherited, no pipes: orphaned
DataLoader workers that keep them open cannot make us hang). The child dies with perfdoctor (see
`child.die_with_parent`); signals to perfdoctor reach it once each, then it is killed (`_wait`).
While it runs, a status line on stderr reads its steps.partial.jsonl (`Progress`, `_Status`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import msgspec

from perfdoctor.capture.receipt import measure_after_run
from perfdoctor.capture.writer import PARTIAL, write, write_meta
from perfdoctor.contracts.run import (
    SCHEMA,
    ClockLine,
    Env,
    Exit,
    Meta,
    Step,
    Steps,
    decode,
    rank_dir_name,
    rank_dirs,
    rank_from_env,
)
from perfdoctor.errors import InputError

_SI_KERNEL = 0x80  # siginfo si_code of a signal the kernel sent (the terminal's Ctrl-C)
RUN_FILES = ("meta.json", "steps.json", "probes.json", "trace.json.gz", "hotspots.json", "profile.pstats",
             "report.json", "report.html", "steps.partial.jsonl", "stuck.json")


@dataclass
class RunResult:
    run_dir: Path
    exit_code: int  # the script's
    reason: str  # completed | steps-reached | sys-exit | exception | interrupted | killed | not-started
    detail: str | None = None  # why it did not start (not-started: `-m` named no module Python can run)


def _job_id() -> str:
    """A name every rank of one job started by an outside launcher agrees on: the SLURM job (and step),
    the torchrun rendezvous id, else the launcher's process (the ranks of one node share it)."""
    slurm = os.environ.get("SLURM_JOB_ID")
    if slurm:
        step = os.environ.get("SLURM_STEP_ID")
        return f"slurm-{slurm}" + (f".{step}" if step else "")
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)[:64]
    return f"{datetime.now():%Y%m%d}-ppid{os.getppid()}"


NAME_MAX = 255  # bytes in one file name (Linux, macOS)


def _folder_name(stem: str, tail: str) -> str:
    """`stem` + `tail` as one folder name that fits NAME_MAX bytes: a long script name is cut (a
    250-character script name must not make its run folder impossible to create)."""
    room = NAME_MAX - len(os.fsencode(tail)) - len("-999")  # the -n of a second run in the same second
    kept, used = [], 0
    for ch in stem:  # whole characters only
        used += len(os.fsencode(ch))
        if used > room:
            break
        kept.append(ch)
    return "".join(kept) + tail


def new_run_dir(target: str, module: bool, out_dir: Path | None, base: Path | None = None) -> Path:
    """`out_dir` itself (emptied of old run files), else a fresh `.perfdoctor/runs/<stem>-<stamp>[-n]`
    under `base` (the current directory). Always absolute: the child gets it as it is, and a script
    that changes directory must not lose its run folder. A folder that cannot be made is one
    InputError line, before anything runs.

    A rank of a distributed job that an outside launcher started (RANK set: torchrun or SLURM running
    perfdoctor) writes `rank-<R>` inside the job folder: `--out-dir` (the CLI's claim_out_dir gives
    `out_dir` as that rank folder already), else `.perfdoctor/runs/<stem>-<job id>`, so that
    `perfdoctor report` on the job folder merges the ranks."""
    rank = rank_from_env()
    if rank is not None and out_dir is None:
        stem = target.rsplit(".", 1)[-1] if module else Path(target).stem
        job = Path(os.path.abspath(base or Path.cwd())) / ".perfdoctor" / "runs" / _folder_name(stem, f"-{_job_id()}")
        out_dir = job / rank_dir_name(rank.rank)
        if (out_dir / "meta.json").exists():
            raise InputError(f"{out_dir} holds a previous run of rank {rank.rank}: give --out-dir DIR (the job "
                             f"folder; each rank writes DIR/rank-<R>)")
    if out_dir is not None:
        out_dir = Path(os.path.abspath(out_dir))
        _mkdir(out_dir, "the run folder", exist_ok=True)
        clear_run_files(out_dir)
        return out_dir
    stem = target.rsplit(".", 1)[-1] if module else Path(target).stem
    root = Path(os.path.abspath(base or Path.cwd())) / ".perfdoctor" / "runs"
    _mkdir(root, "the run folder", exist_ok=True)
    name = _folder_name(stem, f"-{datetime.now():%Y%m%d-%H%M%S}")
    for n in range(1, 1000):
        d = root / (name if n == 1 else f"{name}-{n}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
        except OSError as e:
            raise _cannot_make(d, "the run folder", e) from None
    raise InputError(f"cannot create a run folder under {root}: 999 runs this second already")


def clear_run_files(run_dir: Path) -> None:
    """Remove a previous run's files from `run_dir` (perfdoctor's own files only, nothing else)."""
    for f in RUN_FILES:
        (run_dir / f).unlink(missing_ok=True)


def _mkdir(path: Path, what: str, exist_ok: bool) -> None:
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
    except OSError as e:
        raise _cannot_make(path, what, e) from None


def _cannot_make(path: Path, what: str, e: OSError) -> InputError:
    return InputError(f"cannot create {what} {path} ({e.strerror or e}): give --out-dir DIR in a writable place")


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    pkg_parent = str(Path(__file__).resolve().parents[2])
    if Path(pkg_parent).name not in ("site-packages", "dist-packages"):
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if pkg_parent not in parts:
            env["PYTHONPATH"] = os.pathsep.join(parts + [pkg_parent])
    return env


def _last_step(partial: Path) -> Step | None:
    """The last step the child flushed (it appends one JSON line per step every half second)."""
    try:
        with open(partial, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 512))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith(b'{"i":'):
            try:
                return msgspec.json.decode(line, type=Step)
            except msgspec.MsgspecError:  # a line cut short
                continue
    return None


def _descendants(pid: int) -> list[int]:
    """The processes under `pid` (its DataLoader workers, py-spy, whatever the script started), from
    /proc; none where there is no /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for e in entries:
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])  # the name in brackets may hold anything
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(e))
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the child and every process under it. The child shares perfdoctor's process group (a
    terminal's Ctrl-C and the script's own reads from the terminal must keep working), so the group
    cannot be killed: its processes are found first, then killed with it."""
    below = _descendants(proc.pid)
    proc.kill()
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # gone already
            pass


GRACE_S = 10.0  # after a Ctrl-C-like first signal, the script's time to finish; the same again after SIGTERM
ECHO_S = 0.5  # a signal to perfdoctor that the script did not report receiving within this is passed on


def _wait(proc: subprocess.Popen, on_poll: Callable[[], None], on_start: Callable[[], None],
          reports: int | None = None) -> int:
    """Wait for the child; pass Ctrl-C / SIGTERM on to it once each. Returns how many we received.

    A signal reaches the script once, as it would bare: one sent to the whole process group (a
    terminal's Ctrl-C, GNU timeout, SLURM) reached it already, and is not sent again; one sent to
    perfdoctor alone is passed on as it is (SIGTERM stays SIGTERM: the script's own handler runs,
    saves its checkpoint, and its exit code is perfdoctor's). The child reports what it receives on
    `reports` (a pipe: child.watch_signals); without it, only a terminal's Ctrl-C counts as reached.

    After a first SIGINT the script has GRACE_S to finish, then gets one SIGTERM, and GRACE_S after
    that it and its processes are killed. After a first SIGTERM the script takes the time its
    handler takes (the sender sends SIGKILL when it will not wait longer). A second signal sends
    SIGTERM where none was sent yet, else kills, as does a third. `on_start` runs once the signals
    are set up (threads it starts inherit the blocked mask)."""
    received = 0
    since = 0.0  # when the first signal came
    termed = 0.0  # when SIGTERM was sent or reached the child
    patient = False  # the first signal was SIGTERM: no escalation on a timer
    killed = False
    seen: dict[int, float] = {}  # signal -> when the child last reported receiving it
    pending: list[tuple[int, float]] = []  # (signal, when it came) not passed on yet

    def read_reports() -> None:
        if reports is None:
            return
        try:
            data = os.read(reports, 4096)
        except OSError:  # nothing to read (EAGAIN), or the child is gone
            return
        now = time.monotonic()
        for b in data:
            seen[b] = now

    def terminate() -> None:
        nonlocal termed
        if not termed and proc.poll() is None:
            termed = time.monotonic()
            proc.terminate()

    def kill() -> None:
        nonlocal killed
        if not killed and proc.poll() is None:
            killed = True
            _kill_tree(proc)

    def forward(sig: int, from_terminal: bool) -> None:
        nonlocal received, since, termed, patient
        received += 1
        now = time.monotonic()
        since = since or now
        if received >= 3 or (received == 2 and termed):
            kill()
        elif received == 2:
            terminate()
        else:
            if sig == signal.SIGTERM:
                patient, termed = True, now
            if not from_terminal:
                pending.append((sig, now))

    def pass_on() -> None:
        """Send the pending signals that the child did not report receiving."""
        read_reports()
        now = time.monotonic()
        for sig, at in list(pending):
            if seen.get(sig, -1.0) >= at - ECHO_S or proc.poll() is not None:
                pending.remove((sig, at))  # it reached the script already
            elif now - at >= (ECHO_S if reports is not None else 0.0):
                pending.remove((sig, at))
                proc.send_signal(sig)

    def escalate() -> None:
        # A child that ignores SIGINT (started with it ignored, or a script's own handler that
        # keeps going) gets one SIGTERM, then SIGKILL.
        if since and not patient and proc.poll() is None:
            now = time.monotonic()
            if termed and now - termed > GRACE_S:
                kill()
            elif not termed and now - since > GRACE_S:
                terminate()

    in_main = threading.current_thread() is threading.main_thread()
    sigs = {signal.SIGINT, signal.SIGTERM}
    if in_main and hasattr(signal, "sigtimedwait"):
        old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
        try:
            on_start()
            while proc.poll() is None:
                info = signal.sigtimedwait(sigs, 0.05 if pending else 0.2)
                read_reports()
                if info is not None:
                    # a terminal's Ctrl-C (sent by the kernel) reached the whole foreground process group
                    forward(info.si_signo, info.si_signo == signal.SIGINT and info.si_code == _SI_KERNEL)
                pass_on()
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
                proc.wait(timeout=0.05 if pending else 0.2)
                break
            except subprocess.TimeoutExpired:
                pass_on()
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
    """Make sure meta.json and steps.json exist: the child may have died before writing them (or the
    script deleted the run folder, and the child could not write it again)."""
    _mkdir(run_dir, "the run folder", exist_ok=True)
    meta_path = run_dir / "meta.json"
    try:
        meta = decode(meta_path.read_bytes(), Meta, meta_path)
    except (OSError, InputError):
        meta = None
    if interrupted and code == 1 and (meta is None or (not meta.complete and not meta.env.torch)):
        # Ctrl-C while the child was starting, before torch was imported, let alone the script: an exit
        # of 1 there is the interrupt's (Python's "Fatal Python error: init_import_site" while the
        # interpreter starts; an error torch's import turned the KeyboardInterrupt into: "TypeError:
        # expected a message argument" in torch/__init__.py). The exit code of an interrupt, as after one
        # in the script, is 130
        code = 128 + signal.SIGINT
    if meta is None:
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
    meta.exit = Exit(code=code, reason="interrupted" if interrupted else "killed", traceback=None,
                     at=round(time.time(), 3))
    write_meta(run_dir, meta)
    return meta


def _rate_text(rate: float) -> str:
    if rate >= 9.95:  # what would round to 10.0
        return f"{rate:.0f} steps/s"
    if rate >= 1:
        return f"{rate:.1f} steps/s"
    return f"{1 / rate:.1f} s/step"


def _duration(s: float) -> str:
    if s < 1:
        return "<1 s"
    if s < 90:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


class Progress:
    """What the status line says while `run` is going: steps done, steps/s over the last RATE_WINDOW_S
    of the script's own clock (the first steps are slower: warm-up, compilation), and an ETA when
    the end is known: `--steps N`, else the end of the profiled window (the script may go on after
    it, but the report's evidence is complete then)."""

    RATE_WINDOW_S = 10.0

    def __init__(self, steps_limit: int | None, window_end: int | None):
        self.steps_limit = steps_limit
        self.window_end = window_end
        self.seen: deque[tuple[int, float]] = deque()  # (step, its end in the script's seconds)
        self.recounted = False  # the count started again (optimizer steps found after DataLoader batches, say)

    def update(self, step: Step | None) -> bool:
        """Take the last step flushed; True when it is a new one."""
        if step is None or step.end_s is None:
            return False
        if self.seen and step.i < self.seen[-1][0]:
            self.seen.clear()  # a stronger step clock took over: the count starts again, and says so
            self.recounted = True
        if self.seen and step.i == self.seen[-1][0]:
            return False
        self.seen.append((step.i, step.end_s))
        while len(self.seen) > 2 and step.end_s - self.seen[1][1] >= self.RATE_WINDOW_S:
            self.seen.popleft()
        return True

    @property
    def rate(self) -> float | None:
        if len(self.seen) < 2:
            return None
        (i0, t0), (i1, t1) = self.seen[0], self.seen[-1]
        return (i1 - i0) / (t1 - t0) if t1 > t0 else None

    def parts(self, waited_s: float = 0.0) -> list[str]:
        """The status line's parts; `waited_s`: how long the script has run, for a script that has
        not ended its first step yet."""
        if not self.seen:
            return ["starting" if waited_s < 1 else f"waiting for the first step: {_duration(waited_s)}"]
        i = self.seen[-1][0]
        rate = self.rate
        out = [(f"step {i}/{self.steps_limit}" if self.steps_limit else f"step {i}")
               + (" (count restarted by a stronger step clock)" if self.recounted else "")]
        if rate:
            out.append(_rate_text(rate))
        if self.steps_limit:
            if rate:
                out.append(f"ETA {_duration(max(0, self.steps_limit - i) / rate)}")
        elif self.window_end and i < self.window_end:
            out.append(f"profiled window ends at step {self.window_end}"
                       + (f", ETA {_duration((self.window_end - i) / rate)}" if rate else ""))
        return out


class _Status:
    """The status line on stderr, never on stdout: on a terminal, rich's status updated in place;
    elsewhere (a CI log) a plain line at once ("starting"), then at most every LOG_EVERY_S, when a
    step was added or while the first step is awaited (a script stuck before it says so). `label`
    names the run of several (`run 2 of 3`): each run counts its steps from 1."""

    LOG_EVERY_S = 10.0

    def __init__(self, target: str, partial: Path, progress: Progress, label: str = ""):
        self.target, self.partial, self.progress = target, partial, progress
        self.head = f"perfdoctor: running {target}" + (f" ({label})" if label else "")
        self.tty = sys.stderr.isatty()
        self.live = None
        if self.tty:
            from rich.console import Console

            self.live = Console(stderr=True).status(self.head, spinner="dots")
        self.read_at = 0.0
        self.started = self.logged_at = time.monotonic()
        self.changed = False

    def start(self) -> None:
        self.started = self.logged_at = time.monotonic()
        if self.live is not None:
            self.live.start()
        else:
            self._line(", ")

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()

    def _line(self, sep: str) -> str:
        text = f"{self.head}: " + sep.join(self.progress.parts(time.monotonic() - self.started))
        if self.live is None:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
        return text

    def poll(self) -> None:
        now = time.monotonic()
        if now - self.read_at < 0.5:
            return
        self.read_at = now
        self.changed |= self.progress.update(_last_step(self.partial))
        waiting = not self.progress.seen
        if self.live is not None:
            if self.changed or waiting:
                self.live.update(self._line(" · "))
                self.changed = False
        elif (self.changed or waiting) and now - self.logged_at >= self.LOG_EVERY_S:
            self.logged_at = now
            self.changed = False
            self._line(", ")


STUCK_AFTER_S = 10.0  # without a step ended, where the script is gets looked at after this, then as often again


class StuckWatch:
    """Where a script is while no step has ended: once STUCK_AFTER_S have passed without one, and
    every STUCK_AFTER_S after, `py-spy dump` of the child (the training process) and of every
    process under it (its DataLoader workers), each process's main thread, the latest kept in the
    run folder as stuck.json (contracts.run.Stuck). Removed again when a step ends: the report of a
    run where no step ended says where it was stuck instead of "no problems found". py-spy runs
    with --nonblocking (the script is never paused) and outside the poll: a dump started at one poll
    is read at a later one."""

    def __init__(self, run_dir: Path, progress: Progress, exe: str | None):
        self.path = run_dir / "stuck.json"
        self.progress, self.exe = progress, exe
        self.started = time.monotonic()
        self.next_at = self.started + STUCK_AFTER_S
        self.pending: list[tuple[int, str, subprocess.Popen]] = []
        self.child_pid = 0

    def poll(self) -> None:
        if self.progress.seen:
            if self.next_at:
                self.next_at = 0.0
                self.path.unlink(missing_ok=True)
            return
        if self.pending:
            if all(p.poll() is not None for _, _, p in self.pending):
                self._write()
            return
        if self.exe and self.child_pid and self.next_at and time.monotonic() >= self.next_at:
            self.next_at = time.monotonic() + STUCK_AFTER_S
            for pid, role in [(self.child_pid, "main"), *((c, "child") for c in _descendants(self.child_pid))]:
                try:
                    self.pending.append((pid, role, subprocess.Popen(
                        [self.exe, "dump", "--pid", str(pid), "--json", "--nonblocking", "--full-filenames"],
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)))
                except OSError:
                    self.exe = None
                    return

    def stop(self) -> None:
        for _, _, p in self.pending:
            if p.poll() is None:
                p.kill()
            p.wait()
        self.pending = []

    def _write(self) -> None:
        from perfdoctor.contracts.run import Stuck, StuckFrame, StuckProcess

        procs = []
        pending, self.pending = self.pending, []
        for pid, role, p in pending:
            out = p.stdout.read() if p.stdout is not None else b""
            if p.stdout is not None:
                p.stdout.close()
            try:
                threads = msgspec.json.decode(out) if p.returncode == 0 else []
            except msgspec.MsgspecError:
                threads = []
            main = next((t for t in threads if isinstance(t, dict) and t.get("thread_name") == "MainThread"), None)
            if main is None:
                continue  # not a Python process (a shell, a compiler), or gone already
            frames = _script_frames([StuckFrame(function=str(f.get("name", "")), file=str(f.get("filename", "")),
                                                line=int(f.get("line") or 0))
                                     for f in main.get("frames") or [] if isinstance(f, dict)], role)
            if frames is None:
                if role == "main":
                    return  # the script has ended (the child is finalising): nothing is stuck
                continue
            procs.append(StuckProcess(pid=pid, role=role, frames=frames))
        if procs and not self.progress.seen:
            write(self.path, Stuck(after_s=round(time.monotonic() - self.started, 1), processes=procs))


_PACKAGE = str(Path(__file__).resolve().parents[1])  # perfdoctor's own frames are left out of a stuck stack
_WORKER_LOOP = "_worker_loop"  # torch's DataLoader worker loop: a forked worker's frames inside it are its own


def _script_frames(frames: list, role: str) -> list | None:
    """A dumped main thread's frames (innermost first) that belong to the script: without
    perfdoctor's and runpy's, and for a process under the script (a forked DataLoader worker, whose
    stack starts with the frames of the loop that forked it) only those inside torch's worker loop.
    None for the training process when it is no longer running the script (the child's `main` is
    on the stack with no run of the script inside it: it is writing the run folder)."""
    if role == "main":
        at = next((i for i, f in enumerate(frames) if f.function == "main" and f.file.endswith("capture/child.py")), None)
        if at is None or not any(f.function in ("run_path", "run_module") for f in frames[:at]):
            return None
    else:
        loop = next((i for i, f in enumerate(frames) if f.function == _WORKER_LOOP), None)
        frames = frames[:loop] if loop is not None else frames
    return [f for f in frames if not f.file.startswith(_PACKAGE) and "runpy" not in f.file]


_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def _adopt_orphans() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux): a DataLoader worker whose
    training process died is re-parented to perfdoctor, not to PID 1, and `_end_orphans` ends it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children() -> set[int]:
    me = os.getpid()
    return {pid for pid in _descendants(me) if _ppid(pid) == me}


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _end_orphans(before: set[int]) -> list[int]:
    """End what the script left behind once the child has ended: the processes re-parented to
    perfdoctor since the child started (`before`: its children then), and everything under them.
    SIGTERM, a second for them to go, then SIGKILL; each reaped. Returns their PIDs."""
    orphans = sorted(_children() - before)
    tree = orphans + [d for pid in orphans for d in _descendants(pid)]
    for pid in tree:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 1.0
    left = set(orphans)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            with contextlib.suppress(ChildProcessError, OSError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    left.discard(pid)
        time.sleep(0.02)
    for pid in tree:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in left:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)
    return tree


def _check(target: str, module: bool, steps: int | None) -> None:
    if not module and not Path(target).is_file():
        raise InputError(f"no such script: {target}")
    if steps is not None and steps < 1:
        raise InputError("--steps must be 1 or more")


def _launch(cmd: list[str], target: str, partial: Path, steps: int | None, window: tuple[int, int, int] | None,
            script_stdout_to_stderr: bool, show_status: bool, distributed: bool = False,
            label: str = "", report_signals: bool = False, cwd: Path | None = None,
            quiet: bool = False) -> tuple[int, bool, float]:
    """Start the child command in `cwd` (the script's stdout to stderr where asked, both nowhere when
    `quiet`; with `report_signals`, a pipe on which perfdoctor's child reports the signals it
    receives), show the status line read from `partial` while it runs (`label`: which run of several),
    watch for a script stuck before its first step (`StuckWatch`, not for a distributed job), wait for
    it, and end whatever it left running (`_end_orphans`): (its exit code, as a shell reports a signal,
    whether a signal was passed on to it, the wall time)."""
    from perfdoctor.capture.window import plan
    from perfdoctor.capture.workers import find_py_spy

    stdout: int | None = None
    if quiet:
        stdout = subprocess.DEVNULL
    elif script_stdout_to_stderr:
        try:
            stdout = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            stdout = 2
    skip, warmup, active = plan(steps, window, distributed)
    progress = Progress(steps, skip + warmup + active)
    status = _Status(target, partial, progress, label) if show_status else None
    watch = None if distributed else StuckWatch(partial.parent, progress, find_py_spy())

    def poll() -> None:
        if status is not None:
            status.poll()
        else:
            progress.update(_last_step(partial))
        if watch is not None:
            watch.poll()

    adopting = _adopt_orphans()
    before = _children() if adopting else set()
    reports = None
    if report_signals:  # the child tells what signals it receives (child.watch_signals)
        reports, w = os.pipe()
        os.set_blocking(reports, False)
        cmd = [*cmd[:3], "--signal-fd", str(w), *cmd[3:]]
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, env=_child_env(), stdout=stdout, pass_fds=() if reports is None else (w,),
                                stderr=subprocess.DEVNULL if quiet else None, cwd=cwd)
    finally:
        if reports is not None:
            os.close(w)
    if watch is not None:
        watch.child_pid = proc.pid
    try:
        received = _wait(proc, poll, status.start if status is not None else lambda: None, reports)
    finally:
        if reports is not None:
            os.close(reports)
        if status is not None:
            status.stop()
        if watch is not None:
            watch.stop()
        if proc.poll() is None:  # perfdoctor itself is failing: the script does not outlive it
            _kill_tree(proc)
            proc.wait()
        if adopting:
            _end_orphans(before)
    rc = proc.returncode
    code = rc if rc >= 0 else 128 - rc  # killed by signal N: 128 + N, as a shell reports it
    return code, received > 0, time.monotonic() - t0


def _child_options(steps: int | None, window: tuple[int, int, int] | None, ablate: str | None, timing: bool,
                   module: bool) -> list[str]:
    """capture/child.py's options for a run (a job's ranks take the same)."""
    opts: list[str] = []
    if steps:
        opts += ["--steps", str(steps)]
    if window:
        opts += ["--window", ",".join(str(int(x)) for x in window)]
    if ablate:
        opts += ["--ablate", ablate]
    if timing:
        opts.append("--timing")
    if module:
        opts.append("--module")
    return opts


def run_script(target: str, *, module: bool = False, script_args: list[str] | tuple[str, ...] = (),
               out_dir: Path | None = None, steps: int | None = None, script_stdout_to_stderr: bool = False,
               show_status: bool = False, window: tuple[int, int, int] | None = None, label: str = "",
               cwd: Path | None = None, quiet: bool = False, ablate: str | None = None,
               timing: bool = False) -> RunResult:
    """Run a training script (or `-m` module) under perfdoctor's capture; return where the run folder
    is. `label`: which run of several, for the status line; `cwd`: the script's working folder (default
    ours); `quiet`: its output goes nowhere (the run folder keeps a traceback); `ablate`: an ablation
    of `perfdoctor verify` (capture/ablation.py); `timing`: verify's capture, the step clock alone
    (capture/recorder.py)."""
    _check(target, module, steps)
    run_dir = new_run_dir(target, module, out_dir)
    cmd = [sys.executable, "-m", "perfdoctor.capture.child", "--run-dir", str(run_dir), "--parent-pid", str(os.getpid()),
           *_child_options(steps, window, ablate, timing, module), target, "--", *script_args]
    code, signalled, wall = _launch(cmd, target, run_dir / PARTIAL, steps, window, script_stdout_to_stderr,
                                    show_status, label=label, report_signals=True,
                                    cwd=cwd, quiet=quiet)
    meta = _finish_meta(run_dir, target, module, list(script_args), code, signalled, wall)
    return RunResult(run_dir=run_dir, exit_code=code if meta.exit.code is None else meta.exit.code,
                     reason=meta.exit.reason or "killed",
                     detail=meta.exit.traceback if meta.exit.reason == "not-started" else None)


def launcher_command(launcher_args: list[str], child_args: list[str]) -> list[str]:
    """torch's own elastic launcher (torch.distributed.run, what `torchrun` runs) with
    `launcher_args`, starting perfdoctor's child as every rank's entrypoint (`-m`)."""
    return [sys.executable, "-m", "torch.distributed.run", *launcher_args, "-m", "perfdoctor.capture.child",
            *child_args]


def run_job(target: str, *, module: bool = False, script_args: list[str] | tuple[str, ...] = (),
            launcher_args: list[str] | tuple[str, ...] = (), out_dir: Path | None = None, steps: int | None = None,
            script_stdout_to_stderr: bool = False, show_status: bool = False, label: str = "",
            window: tuple[int, int, int] | None = None, cwd: Path | None = None, quiet: bool = False,
            ablate: str | None = None, timing: bool = False) -> RunResult:
    """Run a distributed training script through torch.distributed.run (`launcher_args`: its options,
    --nproc-per-node N and the rest), every rank under capture: each writes `rank-<R>` inside the job
    folder, with the same profiled window (by step number; `window` as run_script's) and `--steps`.
    `cwd`, `quiet`, `ablate` and `timing` as run_script's. Returns the job folder, and the exit of the first rank
    that failed (else rank 0's)."""
    _check(target, module, steps)
    job_dir = new_run_dir(target, module, out_dir)
    child = ["--run-dir", str(job_dir), "--job", "--parent-pid", str(os.getpid()),
             *_child_options(steps, window, ablate, timing, module)]
    cmd = launcher_command(list(launcher_args), [*child, target, "--", *script_args])
    code, signalled, wall = _launch(cmd, target, job_dir / rank_dir_name(0) / PARTIAL, steps, window,
                                    script_stdout_to_stderr, show_status, distributed=True, label=label,
                                    cwd=cwd, quiet=quiet)
    dirs = rank_dirs(job_dir)
    if not dirs:
        raise InputError(f"torch.distributed.run started no rank (exit {code}): see its error above")
    metas = [_finish_meta(d, target, module, list(script_args), code, signalled, wall) for _, d in dirs]
    if not (timing or signalled):
        measure_after_run([d for _, d in dirs])
    bad = min((m for m in metas if m.exit.code), key=lambda m: m.exit.at or 0.0, default=metas[0])  # failed first
    return RunResult(run_dir=job_dir, exit_code=code if bad.exit.code is None else bad.exit.code,
                     reason=bad.exit.reason or "killed")


# torch.distributed.run's options that take no value; every other option takes one (`--opt v` or `--opt=v`)
_LAUNCHER_FLAGS = {"--standalone", "--run-path", "--run_path", "--use-env", "--use_env"}
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def is_launcher(target: str, module: bool) -> bool:
    """`torchrun` (its console script, by name or path) or `-m torch.distributed.run` given as the
    target: perfdoctor runs the job itself rather than profiling the launcher."""
    return target in LAUNCHER_MODULES if module else Path(target).name == "torchrun"


def split_launcher_args(args: list[str]) -> tuple[list[str], str, bool, list[str]]:
    """The arguments of a `torchrun ... train.py ARGS` command line: (the launcher's options, the
    training script or module, whether it is a module, the script's arguments). The launcher's `-m`
    is taken out (perfdoctor's child is the entrypoint; it runs the module); `--no-python` is refused
    (perfdoctor profiles Python training processes)."""
    launcher: list[str] = []
    module = False
    rest = list(args)
    while rest:
        a = rest.pop(0)
        if a == "--":
            continue
        if not a.startswith("-"):
            return launcher, a, module, rest
        if a in ("-m", "--module"):
            module = True
        elif a in ("--no-python", "--no_python"):
            raise InputError("torchrun --no-python: perfdoctor runs Python training scripts only; "
                             "give the script or module itself")
        elif a in _LAUNCHER_FLAGS or "=" in a:
            launcher.append(a)
        else:
            launcher.append(a)
            if rest:
                launcher.append(rest.pop(0))
    raise InputError("no training script in the torchrun command line (torchrun [options] train.py [args])")
