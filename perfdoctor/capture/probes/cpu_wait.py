"""Time the training thread waited for a CPU on each step: runnable but not running (the kernel's
run-queue delay of the main thread, `/proc/self/schedstat`'s second field: other processes or other
ranks on its cores), plus the time the process's CPU cgroup was throttled by its quota (`cpu.stat`:
`throttled_usec` on cgroup v2, `throttled_time` ns on v1), where those files are readable. A rank that
waits for a CPU more than the others is a straggler for it (the rank table's `cpu_wait_ms`); the
thread's time on a CPU (schedstat's first field) says how much of that wait its own work explains
(on a busy machine a thread with more to run waits longer too).

Read at every step end and again once perfdoctor's own work there is done (`begin_step`: the
profiler's start and stop, the trace's export), so that a step's wait is the wait inside it: two
`pread`s of files opened once each time (a few microseconds); nothing where Linux does not offer them."""

from __future__ import annotations

import os
from pathlib import Path

from perfdoctor.capture.patches import ErrorLog
from perfdoctor.contracts.run import CpuWaitRecord

SCHEDSTAT = "/proc/self/schedstat"  # "<ns on CPU> <ns runnable, waiting for a CPU> <timeslices>"


def cgroup_cpu_stat(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> Path | None:
    """The cpu.stat of this process's CPU cgroup (v2 unified, else v1's cpu controller), or None."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        rel = path.lstrip("/")
        if controllers == "" and (Path(root) / rel / "cpu.stat").is_file() and (Path(root) / "cgroup.controllers").exists():
            return Path(root) / rel / "cpu.stat"
        if "cpu" in controllers.split(","):
            for d in (Path(root) / "cpu" / rel, Path(root) / "cpu,cpuacct" / rel):
                if (d / "cpu.stat").is_file():
                    return d / "cpu.stat"
    return None


def throttled_ms(text: str) -> float | None:
    """The throttled time in a cpu.stat's text, in ms (v2 `throttled_usec`, v1 `throttled_time` ns)."""
    fields = dict(line.split(None, 1) for line in text.splitlines() if " " in line)
    if "throttled_usec" in fields:
        return int(fields["throttled_usec"]) / 1e3
    if "throttled_time" in fields:
        return int(fields["throttled_time"]) / 1e6
    return None


class CpuWaitProbe:
    def __init__(self, err: ErrorLog):
        self.err = err
        self.fds: dict[str, int] = {}
        self.last: tuple[float, float, float | None] | None = None  # the reading at the current step's start
        # [step, ms waiting for a CPU, ms of it the cgroup was throttled, ms the thread ran on a CPU]
        self.by_step: list[list[float]] = []
        self.cgroup = False

    def install(self) -> None:
        try:
            self.fds["sched"] = os.open(SCHEDSTAT, os.O_RDONLY)
        except OSError:
            return
        stat = cgroup_cpu_stat()
        if stat is not None:
            try:
                self.fds["cgroup"] = os.open(stat, os.O_RDONLY)
                self.cgroup = self._read()[2] is not None
            except OSError:
                pass
        self.last = self._read()

    def _read(self) -> tuple[float, float, float | None]:
        """(ms on a CPU, ms waiting for one, ms the cgroup was throttled or None), since the thread began."""
        run, wait = (int(x) / 1e6 for x in os.pread(self.fds["sched"], 128, 0).split()[:2])
        cg = self.fds.get("cgroup")
        return run, wait, throttled_ms(os.pread(cg, 4096, 0).decode()) if cg is not None else None

    def end_step(self, i: int) -> None:
        if self.last is None:
            return
        try:
            now = self._read()
        except (OSError, ValueError, IndexError) as e:
            self.err("cpu_wait", e)
            self.last = None
            return
        (r0, w0, t0), (r1, w1, t1) = self.last, now
        thr = t1 - t0 if t0 is not None and t1 is not None else 0.0
        self.by_step.append([i, round(w1 - w0 + thr, 4), round(thr, 4), round(r1 - r0, 4)])
        self.last = now

    def begin_step(self) -> None:
        """A step starts: its wait counts from here."""
        if self.last is None:
            return
        try:
            self.last = self._read()
        except (OSError, ValueError, IndexError) as e:
            self.err("cpu_wait", e)
            self.last = None

    def merge_steps(self) -> None:
        """A stronger step clock took over: the steps so far are renumbered, start again."""
        self.by_step = []

    def uninstall(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}
        self.last = None

    def records(self) -> CpuWaitRecord | None:
        return CpuWaitRecord(ms_by_step=self.by_step, cgroup=self.cgroup) if self.by_step else None
