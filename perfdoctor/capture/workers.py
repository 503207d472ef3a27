"""py-spy on the DataLoader worker processes through the profiled window (runs in the child).

cProfile and the line sampler see only the training process. With `num_workers > 0` the batches
are made in worker processes, so a slow `__getitem__` or transform is invisible to them: the loop
just waits. py-spy samples those processes from outside, with `--nonblocking` so it never pauses
them, and writes its samples as collapsed stacks ("frame;frame;... count"). It needs the py-spy
executable (a dependency of perfdoctor) and permission to ptrace the workers (root, or
/proc/sys/kernel/yama/ptrace_scope 0); where either is missing the window records why and nothing
else changes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgspec

from perfdoctor.contracts.run import WorkerLine, Workers
from perfdoctor.usercode import is_user_file

RATE_HZ = 200
WORKER_LOOP = "_worker_loop ("  # torch.utils.data._utils.worker._worker_loop, each worker's main loop
# a py-spy frame in --format raw: "function (file:line)"; the file may itself hold spaces or colons
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*):(?P<line>\d+)\)$")


def find_py_spy() -> str | None:
    """The py-spy executable: beside this interpreter (a venv's bin), else on PATH."""
    near = Path(sys.executable).parent / "py-spy"
    if near.is_file() and os.access(near, os.X_OK):
        return str(near)
    return shutil.which("py-spy")


def parse_collapsed(text: str, is_user: Callable[[str], bool] = is_user_file) -> Workers:
    """Samples per innermost user frame (file, line, function) from py-spy's raw output (one or
    several processes' outputs, concatenated). A stack with no user frame (the worker's own loop,
    pickling, torch's collate) counts as `other`."""
    lines: Counter[tuple[str, int, str]] = Counter()
    total = other = 0
    for row in text.splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        # a forked worker's stack starts with the parent's frames (the training loop that created
        # it) down to torch's worker loop: only what runs inside that loop is the worker's work
        for k in range(len(frames) - 1, -1, -1):
            if frames[k].startswith(WORKER_LOOP):
                frames = frames[k + 1:]
                break
        for frame in reversed(frames):
            m = FRAME.match(frame)
            if m and is_user(m["file"]):
                lines[(os.path.abspath(m["file"]), int(m["line"]), m["func"])] += n
                break
        else:
            other += n
    return Workers(samples=total, other_samples=other,
                   lines=[WorkerLine(file=f, line=ln, function=fn, samples=n) for (f, ln, fn), n in lines.most_common(300)])


class WorkerSampler:
    """One `py-spy record` per worker process, from `start` until `stop`."""

    def __init__(self, run_dir: Path, exe: str | None = None):
        self.exe = exe if exe is not None else find_py_spy()
        self.dir = run_dir / "py-spy"
        self.procs: list[tuple[int, subprocess.Popen, Path]] = []
        self.error: str | None = None if self.exe else "py-spy is not installed"

    def start(self, pids: list[int]) -> None:
        if not self.exe or not pids:
            return
        self.dir.mkdir(exist_ok=True)
        for pid in pids:
            out = self.dir / f"worker-{pid}.txt"
            try:
                p = subprocess.Popen([self.exe, "record", "--pid", str(pid), "--rate", str(RATE_HZ), "--format", "raw",
                                      "--output", str(out), "--nonblocking", "--full-filenames"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            except OSError as e:
                self.error = f"py-spy did not start: {e}"
                return
            self.procs.append((pid, p, out))

    def stop(self) -> Workers | None:
        """Stop every recorder (SIGINT makes py-spy write what it has) and merge their samples."""
        if not self.procs:
            return Workers(pids=[], error=self.error) if self.error else None
        for _, p, _ in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        texts, errors = [], []
        for pid, p, out in self.procs:
            try:
                _, err = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            text = out.read_text(errors="replace") if out.exists() else ""
            if not text:
                msg = (err or b"").decode(errors="replace").strip().splitlines()
                errors.append(f"worker {pid}: " + (msg[-1] if msg else f"py-spy exited {p.returncode} with no samples"))
            texts.append(text)
        shutil.rmtree(self.dir, ignore_errors=True)
        # collapsed stacks add up line by line: the workers' outputs together are their merged samples
        return msgspec.structs.replace(parse_collapsed("\n".join(texts)), pids=[pid for pid, _, _ in self.procs],
                                       rate_hz=RATE_HZ, error="; ".join(errors) if errors else None)
