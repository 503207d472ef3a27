"""The coordinator of a capture (runs in the child; imports torch through its caller): wires the
step clock, the probes, the profiled window and the run writer together, installs and uninstalls
them, and finalises the run folder once, whatever way the script ends.

Per step (after the step clock took the step's time): the probes' per-step bookkeeping, during
the first steps the switches below, then the profiled window.

`timing=True` is `perfdoctor verify`'s capture: the step clock and what it needs to count the steps as
the full capture does (the DataLoader and forward probes, for a script that only iterates a loader
through a model, uninstalled at the first step a backward or an optimizer step ends), no other probe,
no profiler, no stall sampler, no CPU matmul rate at the end. Verify
compares a fix's side with the original's; a probe that costs the training thread time on one side
only (the host-read and forward hooks that run inside a `num_workers=0` batch fetch, gone when the fix
moves the fetch into workers) would be counted as the fix's saving.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.env import collect_env, cpu_matmul_flops, user_files
from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.capture.probes.anomaly import AnomalyProbe
from perfdoctor.capture.probes.children import ChildProcessProbe
from perfdoctor.capture.probes.compile import CompileProbe
from perfdoctor.capture.probes.cpu_wait import CpuWaitProbe
from perfdoctor.capture.probes.cuda_batches import CudaBatchProbe
from perfdoctor.capture.probes.dataloader import DataLoaderProbe
from perfdoctor.capture.probes.dataparallel import DataParallelProbe
from perfdoctor.capture.probes.ddp import DdpProbe
from perfdoctor.capture.probes.empty_cache import EmptyCacheProbe
from perfdoctor.capture.probes.flops import FlopProbe
from perfdoctor.capture.probes.forward import ForwardProbe
from perfdoctor.capture.probes.gc_calls import GcCallProbe
from perfdoctor.capture.probes.gc_time import GcTimeProbe
from perfdoctor.capture.probes.gpu_clock import GpuClockProbe
from perfdoctor.capture.probes.holders import HolderScanner
from perfdoctor.capture.probes.host_reads import HostReadProbe
from perfdoctor.capture.probes.host_tensors import HostTensorProbe
from perfdoctor.capture.probes.memory_objects import MemoryObjectsProbe
from perfdoctor.capture.probes.modules import ModuleProbe
from perfdoctor.capture.probes.stalls import StallSampler
from perfdoctor.capture.probes.user_profiler import UserProfilerGuard
from perfdoctor.capture.window import BUDGET_EVENTS, BUDGET_S, Window
from perfdoctor.capture.writer import RunWriter
from perfdoctor.contracts.run import Exit, Meta, Probes

SCAN_STEPS = 30  # loss holders are looked for during the first steps only
FWD_DISCOVERY_STEPS = 3  # top-level modules first called after these steps are not followed
TIMING = "timing"  # meta.json `capture` of a timing-only run
BUDGET_ENV = "PERFDOCTOR_WINDOW_BUDGET"  # "SECONDS[,EVENTS]": the profiled window's budget (window.py)


def window_budget(value: str | None) -> tuple[float, int]:
    """The window's budget from `PERFDOCTOR_WINDOW_BUDGET` ("SECONDS[,EVENTS]"), else the defaults."""
    if not value:
        return BUDGET_S, BUDGET_EVENTS
    parts = value.split(",")
    try:
        return float(parts[0]), int(float(parts[1])) if len(parts) > 1 and parts[1] else BUDGET_EVENTS
    except ValueError:
        print(f"perfdoctor: ignoring {BUDGET_ENV}={value!r} (expected SECONDS[,EVENTS], e.g. 20,1000000)",
              file=sys.stderr)
        return BUDGET_S, BUDGET_EVENTS


class Recorder:
    def __init__(self, torch: Any, run_dir: Path, meta: Meta, *, steps_limit: int | None = None,
                 window: tuple[int, int, int] = (5, 2, 5), timing: bool = False):
        self.torch = torch
        self.timing = timing
        self.run_dir = run_dir
        self.meta = meta  # as written when the child started; completed by finalise
        self.window_cfg = window
        self.budget = window_budget(os.environ.get(BUDGET_ENV))
        self.errors = ErrorLog()
        self.writer = RunWriter(run_dir)
        self.clock = StepClock(torch, self.writer, self.errors, steps_limit=steps_limit)
        self.clock.on_step, self.clock.on_merge, self.clock.on_limit = self._on_step, self._on_merge, self._on_limit
        self.cuda_batches = CudaBatchProbe(torch)
        self.dataloader = DataLoaderProbe(torch, self.clock, self.cuda_batches, self.errors)
        self.modules = ModuleProbe(torch, self.errors)
        self.forward = ForwardProbe(torch, self.clock, self.errors, self.modules)
        self.empty_cache = EmptyCacheProbe(torch, self.clock, self.errors)
        self.children = ChildProcessProbe(self.errors)
        self.anomaly = AnomalyProbe(torch, self.clock, self.errors)
        self.dataparallel = DataParallelProbe(torch, self.errors)
        self.holders = HolderScanner(torch)
        self.host_reads = HostReadProbe(torch, self.clock, self.errors)
        self.host_tensors = HostTensorProbe(torch, self.errors)
        self.dataloader.host = self.host_tensors
        self.gc_calls = GcCallProbe(self.clock, self.errors)
        self.ddp = DdpProbe(torch, self.clock, self.errors)
        self.gc_time = GcTimeProbe(self.clock, self.errors, lambda: self.forward.busy)
        self.stalls = StallSampler(self.clock, self.errors)
        self.compile = CompileProbe(self.errors)
        self.cpu_wait = CpuWaitProbe(self.errors, self.dataloader.worker_pids)
        self.gpu_clock = GpuClockProbe(torch, self.errors)
        self.memory_objects = MemoryObjectsProbe(torch, self.errors)
        self.flops = FlopProbe(torch, self.errors)
        self.window = self._new_window()
        self.user_profiler = UserProfilerGuard(torch, lambda: self.window, self.errors)
        self.forward.poll = self.dataloader.poll = self._poll  # the window's time budget, inside long steps
        self.pid = os.getpid()
        self.main_ident = threading.get_ident()
        self.finalised = False
        self._fork_hooked = False
        self._exit_patch = Patches()
        # installed in this order, uninstalled in the reverse one
        self._probes: tuple[Any, ...] = (self.clock, self.dataloader, self.modules, self.forward, self.empty_cache, self.anomaly, self.dataparallel,
                        self.host_reads, self.host_tensors, self.user_profiler, self.gc_calls, self.ddp, self.gc_time,
                        self.stalls, self.compile, self.cpu_wait, self.gpu_clock, self.memory_objects, self.flops, self.children)
        if timing:
            self._probes = (self.clock, self.dataloader, self.forward)
            self.forward.count_only, self.forward.modules = True, None
            meta.capture = TIMING

    @property
    def stopping(self) -> bool:
        """--steps was reached (the run folder was written then)."""
        return self.clock.stopping

    def _new_window(self) -> Window:
        return Window(self.torch, self.run_dir, *self.window_cfg, worker_pids=self.dataloader.worker_pids,
                      budget_s=self.budget[0], budget_events=self.budget[1], rss=self.clock.rss)

    def _poll(self) -> None:
        t0 = self.window.poll()
        if t0 is not None:  # the budget ended the window inside a step: stopping it is perfdoctor's time
            self.clock.exclude(t0)

    # -- installation ---------------------------------------------------------------------------
    def install(self) -> None:
        for p in self._probes:
            p.install()
        rec, real_exit = self, self.clock.real_exit

        def _exit(code: int = 0) -> None:
            if os.getpid() == rec.pid and not rec.finalised:
                try:
                    rec.finalise("sys-exit", int(code) & 0xFF)
                except BaseException:  # noqa: BLE001
                    pass
            real_exit(code)

        self._exit_patch.replace(os, "_exit", _exit)
        if not self._fork_hooked:  # cannot be unregistered: registered once, for as long as the process lives
            self._fork_hooked = True
            os.register_at_fork(after_in_child=self._forked)
        if self.window.next_at == 0 and not self.timing:
            self.window.tick(0)

    def uninstall(self, *, forked: bool = False) -> None:
        """Every probe off, in the reverse order of installing (two probes may wrap one function).
        `forked`: in a copy `os.fork()` made, where NVML's state is the parent's and stays alone."""
        self._exit_patch.undo()
        if self.cuda_batches.active:
            self.cuda_batches.uninstall()
        for p in reversed(self._probes):
            if not (forked and p is self.gpu_clock):
                p.uninstall()

    def _forked(self) -> None:
        """In the copy of the script that `os.fork()` made: perfdoctor stays out of it. The run and its
        profiler are the parent's: nothing is counted, profiled or written here (the copy's steps would
        land in the parent's steps file, and its end would write the run folder over the parent's)."""
        if os.getpid() == self.pid:
            return
        self.finalised = True
        self.clock.closed, self.clock.stopping = True, False
        self.window.forget()
        # the copy runs bare: every probe comes off, in this process only (a DataLoader worker, started
        # again at every epoch without persistent workers, would otherwise run its dataset's code under the
        # wrappers, each line's first read or tensor creation walking the stack in every new worker: the
        # epoch start PD015 measures would grow by it). Threads do not survive a fork; closing the copy's
        # file descriptors leaves the parent's open.
        self.uninstall(forked=True)

    # -- driven by the step clock ---------------------------------------------------------------
    def _on_step(self, i: int) -> None:
        if self.timing:  # no probe keeps per-step records, no profiler opens
            if i == FWD_DISCOVERY_STEPS:
                self.forward.stop_discovery()
            if self.clock.kind in ("backward", "optimizer") and self._probes != (self.clock,):
                # the clock needs the loader and forward counts only while batches could still end steps:
                # a stronger clock took over, so from here the step clock runs alone
                self.forward.uninstall()
                self.dataloader.uninstall()
                self._probes = (self.clock,)
            return
        self.flops.step_ended(i)
        self.cpu_wait.end_step(i)
        self.compile.end_step(i)
        self.gpu_clock.end_step(i)
        self.dataloader.end_step()
        self.host_reads.end_step()
        self.host_tensors.end_step(i)
        self.cuda_batches.end_step(i)
        if not self.host_reads.cuda_run and self.cuda_batches.active:
            self.host_reads.cuda_run = True  # from CUDA's first use on, only device tensors count
        if i <= SCAN_STEPS:
            self._early(i)
        if i >= self.window.next_at:
            self.window.tick(i, self.clock.steps[-1][2] / 1e3 if self.clock.steps else None)
        # no profiler before the counted step ends, no code torch.compile compiled
        self.flops.after_step(i, self.window.state == "wait" and self.window.next_at > i + 1
                              and not self.compile.frames)
        self.cpu_wait.begin_step()  # the next step's wait counts from here, after perfdoctor's work above

    def _early(self, i: int) -> None:
        if i == FWD_DISCOVERY_STEPS:
            self.forward.stop_discovery()
        if self.window.state in ("wait", "done"):  # never inside a profiled step
            self.holders.scan(i, sys._getframe())

    def _on_merge(self) -> None:
        """A stronger step clock took over: what was counted by steps starts again."""
        self.dataloader.merge_steps()
        self.flops.merge_steps()
        self.host_reads.merge_steps()
        self.cpu_wait.merge_steps()
        self.gpu_clock.merge_steps()
        if self.window.state != "wait":
            self.window.discard()
        self.window = self._new_window()
        self.holders.clear()

    def _on_limit(self) -> None:
        self.finalise("steps-reached", 0)

    # -- the end --------------------------------------------------------------------------------
    def finalise(self, reason: str, code: int, traceback: str | None = None) -> None:
        """Stop the profiler and write the run folder. Safe to call once from any exit path."""
        if self.finalised:
            return
        self.finalised = True
        self.clock.closed = True
        main = threading.get_ident() == self.main_ident
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            self._write_all(reason, code, traceback)
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)

    def _write_all(self, reason: str, code: int, tb: str | None) -> None:
        end = self.clock.pc()
        try:
            hotspots = self.window.finish()
            if hotspots is not None:
                self.writer.hotspots(hotspots)
        except Exception as e:  # noqa: BLE001
            self.errors("window", e)
        steps = self.clock.steps
        if self.clock.kind is None or not steps:  # no step clock: the whole run is one span
            steps = [self.clock.whole_run(end)]
            self.dataloader.whole_run()
            self.host_reads.whole_run()
        probes = Probes(dataloaders=self.dataloader.records(), dataparallel=self.dataparallel.records(),
                        empty_cache=self.empty_cache.records(), anomaly=self.anomaly.records(), children=self.children.records(),
                        forward=self.forward.records(), loss_holders=self.holders.records(),
                        host_tensors=self.host_tensors.records(), host_factories=self.host_tensors.watch_record(),
                        host_reads=self.host_reads.records(), gc_calls=self.gc_calls.records(), ddp=self.ddp.records(),
                        gc_time=self.gc_time.records(), stalls=self.stalls.records(),
                        eval_grad=self.forward.eval_grad_records(), compile=self.compile.records(len(steps) + 1),
                        cpu_wait=self.cpu_wait.records(), gpu_clock=self.gpu_clock.records(),
                        memory_objects=self.memory_objects.records(), flops=self.flops.records(),
                        losses=self.clock.losses(), anomaly_stack_ms=self.anomaly.stack_records(),
                        step_chain=self.clock.step_chain)
        meta = self.meta
        meta.wall_s = round(end - self.clock.t0, 4)
        meta.exit = Exit(code=code, reason=reason, traceback=tb, at=round(time.time(), 3))
        meta.step_clock = self.clock.kind or "none"
        meta.window = None if self.timing else self.window.meta()
        meta.env = collect_env(self.torch, self.clock.device_mem.used, self.clock.device_mem.peaks)
        if meta.env.device != "cuda" and reason in ("completed", "steps-reached") and steps and not self.timing:
            rate = cpu_matmul_flops(self.torch)  # the MFU's denominator, after the script's last step
            if rate:
                meta.env.cpu_matmul_flops = round(rate, 1)
        meta.steps_limit = self.clock.steps_limit
        meta.user_files = user_files(meta.script, meta.cwd, meta.module)
        meta.probe_errors = self.errors.items
        meta.complete = True
        self.writer.finish(steps, probes, meta)
