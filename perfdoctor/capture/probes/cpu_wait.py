"""How long the training thread, and the DataLoader workers, waited for a CPU on each step (PD018's
measured contention; a straggler rank's "waiting for a CPU" cause).

Linux counts, per thread, the time it spent running and the time it spent runnable but waiting on a
run queue (`/proc/<pid>/task/<tid>/schedstat`: on-CPU ns, run-queue wait ns, timeslices). The
training thread's reading is taken at every step end and again once perfdoctor's own work there is
done (`begin_step`: the profiler's start and stop, the trace's export), so that a step's wait is
the wait inside it: what the step lost to other runnable threads on the machine (other processes,
other ranks on its cores, its own DataLoader workers). Where the process's CPU cgroup has a quota,
the time it was throttled (`cpu.stat`: `throttled_usec` on cgroup v2, `throttled_time` ns on v1) is
added to the wait and kept apart too, with the quota periods in which it was throttled (`nr_throttled`). At every step end the main thread of each DataLoader worker
process alive then is read as well: the workers' time on a CPU plus their wait, over the step, is
how many of them were runnable at once on average. The CPU time of the whole machine (/proc/stat)
and of this process (/proc/self/stat), both in clock ticks, tell the workers' share of what the
training thread competed with; the steal ticks of /proc/stat are the time a hypervisor gave this
VM's CPUs to other guests. Over the step, as the training thread's: this process's CPU time, all its
threads (CLOCK_PROCESS_CPUTIME_ID, nanoseconds); with the workers' time on a CPU it is the process
tree's CPU time per step (`tree_ms`), what the gate judges beside the wall time on a loaded host,
less perfdoctor's own threads' time on a CPU (`own_ms`: the `perfdoctor-*` threads' schedstat; a
script's tree does not have them, and PD002's bound on a CPU run must not count them as its work).
The host's CPU pressure (`/proc/pressure/cpu`, PSI: the time at least one runnable task waited for
a CPU, anywhere on the machine), where the kernel has it, and the load average at the run's start
and end tell how busy the host was. One `pread` per file, each opened once (a few microseconds).
Absent where the kernel has no schedstat (nothing is recorded then).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from perfdoctor.capture.patches import ErrorLog
from perfdoctor.contracts.run import CpuWaitRecord

OWN_THREADS = "perfdoctor-"  # perfdoctor's own threads' names start so (the stall sampler, the window's sampler)


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


def throttling(text: str) -> tuple[float, int] | None:
    """The throttled time in a cpu.stat's text, in ms (v2 `throttled_usec`, v1 `throttled_time` ns), and
    the quota periods in which the cgroup was throttled (`nr_throttled`, 0 where absent)."""
    fields = dict(line.split(None, 1) for line in text.splitlines() if " " in line)
    periods = int(fields.get("nr_throttled", 0))
    if "throttled_usec" in fields:
        return int(fields["throttled_usec"]) / 1e3, periods
    if "throttled_time" in fields:
        return int(fields["throttled_time"]) / 1e6, periods
    return None


class CpuWaitProbe:
    def __init__(self, err: ErrorLog, worker_pids: Callable[[], list[int]] = list):
        self.err = err
        self.worker_pids = worker_pids
        self.fd: int | None = None
        self.cgroup_fd: int | None = None
        self.last: tuple[int, int] | None = None  # the training thread's reading at the step's start
        self.last_throttled: tuple[float, int] | None = None  # ms, periods
        self.workers: dict[int, tuple[int, tuple[int, int]]] = {}  # pid -> (fd, last reading)
        self.ticks: dict[str, int] = {}  # "machine" / "process" -> fd of /proc/stat, /proc/self/stat
        self.last_ticks = (0, 0, 0)
        self.tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 10.0
        self.pressure_fd: int | None = None
        self.last_pressure = 0.0  # ms of the host's CPU pressure ("some" total) so far
        self.last_cpu = 0.0  # this process's CPU time (ms) at the step's start
        # perfdoctor's own threads (`perfdoctor-*`): native id -> (fd of its schedstat, on-CPU ns at the step's start)
        self.own: dict[int, tuple[int, int]] = {}
        self.rec = _empty()

    def install(self) -> None:
        try:
            self.fd = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
            self.last = _read(self.fd)
            stat = cgroup_cpu_stat()
            if stat is not None:
                try:
                    self.cgroup_fd = os.open(stat, os.O_RDONLY)
                    self.last_throttled = self._throttled()
                    self.rec.cgroup = self.last_throttled is not None
                except (OSError, ValueError):
                    self.cgroup_fd, self.last_throttled = None, None
            self.ticks = {"machine": os.open("/proc/stat", os.O_RDONLY),
                          "process": os.open(f"/proc/{os.getpid()}/stat", os.O_RDONLY)}
            self.last_ticks = self._ticks()
            self.last_cpu = _process_cpu_ms()
            self.rec.loadavg = [round(v, 2) for v in os.getloadavg()]
            try:
                self.pressure_fd = os.open("/proc/pressure/cpu", os.O_RDONLY)
                self.last_pressure = self._pressure()
                self.rec.pressure = True
            except (OSError, ValueError, IndexError):  # no PSI in this kernel (or it is switched off)
                if self.pressure_fd is not None:
                    os.close(self.pressure_fd)
                self.pressure_fd = None
        except (OSError, ValueError, IndexError):
            self.uninstall()

    def uninstall(self) -> None:
        for fd in [w[0] for w in self.workers.values()] + list(self.ticks.values()) + [o[0] for o in self.own.values()]:
            os.close(fd)
        self.workers, self.ticks, self.own = {}, {}, {}
        if self.pressure_fd is not None:
            os.close(self.pressure_fd)
            self.pressure_fd = None
        if self.cgroup_fd is not None:
            os.close(self.cgroup_fd)
            self.cgroup_fd = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def end_step(self, i: int) -> None:
        """Step `i` ended: the training thread's wait and time on a CPU since the step began
        (`begin_step`), the workers' and the machine's since the previous step end."""
        if self.fd is None or self.last is None:
            return
        try:
            now = _read(self.fd)
            cpu = _process_cpu_ms()
            r = self.rec
            while len(r.wait_ms) < i - 1:  # steps missed: nothing known of them
                for xs in (r.wait_ms, r.run_ms, r.throttled_ms, r.workers_wait_ms, r.workers_run_ms, r.machine_ms,
                           r.process_ms, r.tree_ms, r.own_ms, r.steal_ms, r.pressure_ms):
                    xs.append(0.0)
                r.workers.append(0)
                r.throttled_periods.append(0)
            thr, last = self._throttled(), self.last_throttled
            throttled, periods = (thr[0] - last[0], thr[1] - last[1]) if thr is not None and last is not None else (0.0, 0)
            self.last_throttled = thr
            r.run_ms.append(round((now[0] - self.last[0]) / 1e6, 4))
            r.wait_ms.append(round((now[1] - self.last[1]) / 1e6 + throttled, 4))
            r.throttled_ms.append(round(throttled, 4))
            r.throttled_periods.append(periods)
            self.last = now
            on, wait, n = self._workers()
            r.workers_run_ms.append(round(on / 1e6, 4))
            r.workers_wait_ms.append(round(wait / 1e6, 4))
            r.workers.append(n)
            own = self._own(start=False)
            r.own_ms.append(round(own / 1e6, 4))
            r.tree_ms.append(round(cpu - self.last_cpu - own / 1e6 + on / 1e6, 4))
            ticks = self._ticks()
            r.machine_ms.append(round((ticks[0] - self.last_ticks[0]) * self.tick_ms, 1))
            r.process_ms.append(round((ticks[1] - self.last_ticks[1]) * self.tick_ms, 1))
            r.steal_ms.append(round((ticks[2] - self.last_ticks[2]) * self.tick_ms, 1))
            self.last_ticks = ticks
            pressure = self._pressure() if self.pressure_fd is not None else 0.0
            r.pressure_ms.append(round(pressure - self.last_pressure, 3))  # 0 where unmeasured (rec.pressure)
            self.last_pressure = pressure
        except (OSError, ValueError, IndexError) as e:
            self.err("cpu_wait", e)
            self.uninstall()

    def begin_step(self) -> None:
        """A step starts (perfdoctor's own work at the step end is done): the training thread's wait
        counts from here."""
        if self.fd is None:
            return
        try:
            self.last = _read(self.fd)
            self.last_cpu = _process_cpu_ms()
            self._own(start=True)
            self.last_throttled = self._throttled()
        except (OSError, ValueError, IndexError) as e:
            self.err("cpu_wait", e)
            self.uninstall()

    def _throttled(self) -> tuple[float, int] | None:
        """The CPU cgroup's throttled time so far (ms) and its throttled periods, or None where they
        cannot be read."""
        if self.cgroup_fd is None:
            return None
        return throttling(os.pread(self.cgroup_fd, 4096, 0).decode())

    def _own(self, start: bool) -> int:
        """perfdoctor's own threads' on-CPU ns since the step's start (`start`: take the start's readings,
        0). A thread seen first at the step's end counts from then (nothing); one that ended is dropped."""
        alive = {t.native_id for t in threading.enumerate() if t.name.startswith(OWN_THREADS) and t.native_id}
        for tid in list(self.own):
            if tid not in alive:
                os.close(self.own.pop(tid)[0])
        total = 0
        for tid in alive:
            try:
                o = self.own.get(tid)
                fd = o[0] if o is not None else os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
                now = _read(fd)[0]
            except (OSError, ValueError, IndexError):  # it just ended
                if o is None:
                    continue
                os.close(self.own.pop(tid)[0])
                continue
            if o is not None and not start:
                total += now - o[1]
            self.own[tid] = (fd, now) if start or o is None else o
        return total

    def _workers(self) -> tuple[int, int, int]:
        """The workers' on-CPU and run-queue ns since the last step end (a new worker: its whole life, which
        began after it, as the loader that starts workers does so inside a step: a short pass's batches are
        all loaded ahead in its first step), and how many were read."""
        on = wait = n = 0
        alive = set(self.worker_pids())
        for pid in list(self.workers):
            if pid not in alive:
                os.close(self.workers.pop(pid)[0])
        for pid in alive:
            w = self.workers.get(pid)
            try:
                if w is None:
                    fd = os.open(f"/proc/{pid}/schedstat", os.O_RDONLY)
                    w = self.workers[pid] = (fd, (0, 0))
                fd, last = w
                now = _read(fd)
            except (OSError, ValueError, IndexError):  # it just ended
                continue
            on += now[0] - last[0]
            wait += now[1] - last[1]
            n += 1
            self.workers[pid] = (fd, now)
        return on, wait, n

    def _ticks(self) -> tuple[int, int, int]:
        """Busy clock ticks of the whole machine (all CPUs: user, nice, system, irq, softirq, steal),
        of this process (user + system) and the machine's steal ticks, so far."""
        cpu = os.pread(self.ticks["machine"], 256, 0).split(b"\n", 1)[0].split()
        busy = sum(int(cpu[k]) for k in (1, 2, 3, 6, 7, 8) if k < len(cpu))

        own = os.pread(self.ticks["process"], 1024, 0).rsplit(b")", 1)[1].split()
        steal = int(cpu[8]) if len(cpu) > 8 else 0
        return busy, int(own[11]) + int(own[12]), steal  # fields 14 and 15 of /proc/pid/stat

    def _pressure(self) -> float:
        """The host's CPU pressure so far: ms in which some runnable task waited for a CPU (PSI's
        "some" line, `total=` in µs)."""
        assert self.pressure_fd is not None
        line = os.pread(self.pressure_fd, 256, 0).split(b"\n", 1)[0]
        return int(line.rsplit(b"total=", 1)[1]) / 1e3

    def merge_steps(self) -> None:
        """A stronger step clock took over: its steps are counted from 1 again."""
        old = self.rec
        self.rec = _empty()
        self.rec.cgroup, self.rec.pressure, self.rec.loadavg = old.cgroup, old.pressure, old.loadavg

    def records(self) -> CpuWaitRecord | None:
        if not self.rec.wait_ms:
            return None
        if hasattr(os, "getloadavg"):
            self.rec.loadavg_end = [round(v, 2) for v in os.getloadavg()]
        return self.rec


def _empty() -> CpuWaitRecord:
    return CpuWaitRecord(wait_ms=[], run_ms=[], throttled_ms=[], throttled_periods=[], workers_wait_ms=[],
                         workers_run_ms=[], workers=[], machine_ms=[], process_ms=[], tree_ms=[], own_ms=[],
                         steal_ms=[], pressure_ms=[])


def _process_cpu_ms() -> float:
    """This process's CPU time so far, all its threads, in ms (CLOCK_PROCESS_CPUTIME_ID)."""
    return time.process_time_ns() / 1e6


def _read(fd: int) -> tuple[int, int]:
    parts = os.pread(fd, 128, 0).split()
    return int(parts[0]), int(parts[1])
