"""The capture probes of the checklist rules, driven by a stand-in step clock (no torch): gc.collect()
calls per site and step (PD027), the run-long stack sampler (PD020), the CPU waits from schedstat
(PD018), dynamo's records read after each step (PD029, from a stand-in `torch._dynamo.utils`),
torch.cuda.empty_cache() calls inside the steps (PD005, a stand-in `torch.cuda`); the
DataLoader start-up times (PD015) are covered end to end by tests/analysis/test_e2e_samples.py, the eval-mode
forwards (PD019) by tests/capture/test_program_unchanged.py (real torch)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import traceback
import types
from pathlib import Path

import pytest

from perfdoctor.capture.patches import ErrorLog
from perfdoctor.capture.probes.children import ChildProcessProbe
from perfdoctor.capture.probes.compile import CompileProbe
from perfdoctor.capture.probes.cpu_wait import CpuWaitProbe
from perfdoctor.capture.probes.empty_cache import EmptyCacheProbe
from perfdoctor.capture.probes.gc_calls import GcCallProbe
from perfdoctor.capture.probes.stalls import StallSampler


class Clock:
    """What the probes read of `capture.clock.StepClock`."""

    def __init__(self) -> None:
        self.pc = time.perf_counter
        self.kind: str | None = None
        self.steps: list[tuple] = []
        self.own = 0.0
        self.step_start = self.pc()

    def exclude(self, t0: float) -> None:
        self.own += self.pc() - t0

    def tick(self) -> None:
        now = self.pc()
        self.steps.append((len(self.steps) + 1, 0.0, (now - self.step_start) * 1e3))
        self.step_start = now


def test_empty_cache_calls_count_inside_steps_only(monkeypatch):
    monkeypatch.setattr("perfdoctor.capture.sites.is_user_file", lambda f: f == __file__)
    freed: list[int] = []
    cuda = types.SimpleNamespace(empty_cache=lambda: freed.append(1))
    torch = types.SimpleNamespace(cuda=cuda)
    clock = Clock()
    probe = EmptyCacheProbe(torch, clock, ErrorLog())  # type: ignore[arg-type]
    probe.install()

    def teardown() -> None:  # a library's end of fit, after the last step
        torch.cuda.empty_cache()
    try:
        torch.cuda.empty_cache()  # set-up, before the first step ended
        clock.tick()
        for _ in range(3):
            torch.cuda.empty_cache()
            clock.tick()
        teardown()
    finally:
        probe.uninstall()
    assert len(freed) == 5 and torch.cuda.empty_cache is cuda.empty_cache
    recs = sorted(probe.records(), key=lambda r: r.site.line)
    assert [(r.calls, r.calls_in_steps) for r in recs] == [(1, 0), (1, 0), (3, 3)]  # teardown, set-up, loop


def _child() -> None:
    pass


def test_processes_the_script_starts_are_noted_not_dataloader_workers(monkeypatch):
    import multiprocessing
    import multiprocessing.process as mpp

    import torch
    from torch.multiprocessing.spawn import _wrap
    from torch.utils.data import DataLoader, TensorDataset

    monkeypatch.setattr("perfdoctor.capture.sites.is_user_file", lambda f: f == __file__)
    real = mpp.BaseProcess.start
    probe = ChildProcessProbe(ErrorLog())
    probe.install()
    try:
        p = multiprocessing.get_context("fork").Process(target=_child)
        p.start()  # the script's own process
        p.join()
        for _ in DataLoader(TensorDataset(torch.zeros(4)), batch_size=2,
                            num_workers=1, multiprocessing_context="fork"):  # a worker: not noted
            pass
        # torch.multiprocessing.spawn's wrapper: the user's function is what the process runs
        probe._note(types.SimpleNamespace(_target=_wrap, _args=(_child, 0, (), None), _start_method="spawn"),
                    sys._getframe())
    finally:
        probe.uninstall()
    assert mpp.BaseProcess.start is real
    recs = sorted(probe.records(), key=lambda r: r.site.line)
    assert [(r.target, r.method, r.started) for r in recs] == [("_child", "fork", 1), ("_child", "spawn", 1)]
    assert all(r.site.file == __file__ for r in recs)


@pytest.mark.slow
def test_gc_calls_counted_per_site_and_step(monkeypatch):
    monkeypatch.setattr("perfdoctor.capture.sites.is_user_file", lambda f: f == __file__)
    clock = Clock()
    probe = GcCallProbe(clock, ErrorLog())  # type: ignore[arg-type]
    real = gc.collect
    probe.install()
    try:
        gc.collect()  # before the first step: not on a step
        clock.kind = "optimizer"
        for _ in range(3):
            for _ in range(2):
                gc.collect()
            clock.tick()
    finally:
        probe.uninstall()
    assert gc.collect is real
    recs = {r.site.line: r for r in probe.records() if r.site is not None}
    assert len(recs) == 2
    before, in_loop = sorted(recs.values(), key=lambda r: r.site.line)
    assert before.calls == 1 and before.calls_in_steps == 0 and before.ms_by_step == []
    assert in_loop.calls == 6 and in_loop.calls_in_steps == 6
    assert [row[0] for row in in_loop.ms_by_step] == [1, 2, 3] and all(row[2] == 2 for row in in_loop.ms_by_step)
    assert all(row[1] > 0 for row in in_loop.ms_by_step)


def _checkpoint():
    time.sleep(0.06)


def test_stall_sampler_sees_the_line_on_its_steps(monkeypatch):
    monkeypatch.setattr("perfdoctor.capture.probes.stalls.is_user_file", lambda f: f == __file__)
    clock = Clock()
    sampler = StallSampler(clock, ErrorLog())  # type: ignore[arg-type]
    sampler.install()
    clock.kind = "optimizer"
    for i in range(1, 7):
        time.sleep(0.02)
        if i % 3 == 0:
            _checkpoint()  # the slow steps
        clock.tick()
    st = sampler.records()
    assert not sampler.is_alive() and not sampler.err.items
    assert st.samples_by_step and st.interval_s
    ckpt = [x for x in st.lines if x.site is not None and x.site.function == "_checkpoint"]
    assert ckpt and {i for i, _ in ckpt[0].by_step} <= {3, 6}
    # the looks taken while a step ran long are those of the slow steps
    assert st.late_by_step and {i for i, _ in st.late_by_step} <= {3, 6}
    call = [x for x in st.lines if x.site is not None and x.site.code == "_checkpoint()  # the slow steps"]
    assert call and call[0].depth < ckpt[0].depth


@pytest.mark.skipif(not Path(f"/proc/self/task/{os.getpid()}/schedstat").exists(), reason="no schedstat")
def test_cpu_wait_reads_the_training_thread_and_the_workers():
    # a stand-in worker: a process that keeps a CPU busy
    worker = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 5: pass"])
    try:
        probe = CpuWaitProbe(ErrorLog(), lambda: [worker.pid])
        probe.install()
        for i in range(1, 5):
            t = time.perf_counter()
            while time.perf_counter() - t < 0.05:  # the step's own work
                pass
            probe.end_step(i)
        rec = probe.records()
        probe.uninstall()
    finally:
        worker.kill()
        worker.wait()
    assert rec is not None and len(rec.wait_ms) == len(rec.run_ms) == len(rec.workers_run_ms) == 4
    # 50 ms spinning per step: on a CPU or waiting for one all the time (the rest is the loop's own)
    assert all(r + w > 40 for r, w in zip(rec.run_ms, rec.wait_ms)), (rec.run_ms, rec.wait_ms)
    # a worker first seen at a step's end counts its whole life (a loader starts its workers inside a step)
    assert rec.workers == [1, 1, 1, 1] and rec.workers_run_ms[0] + rec.workers_wait_ms[0] > 40
    assert sum(rec.workers_run_ms) + sum(rec.workers_wait_ms) > 50  # it was runnable through the steps
    assert sum(rec.machine_ms) >= sum(rec.process_ms) > 0
    # the process tree: this process's 50 ms of spinning per step (less what it waited), plus the worker's
    assert len(rec.tree_ms) == len(rec.steal_ms) == len(rec.pressure_ms) == 4
    assert all(t >= r - 1 for t, r in zip(rec.tree_ms, rec.run_ms)), (rec.tree_ms, rec.run_ms)
    assert sum(rec.tree_ms) > sum(rec.run_ms) + 0.5 * sum(rec.workers_run_ms)
    assert all(v >= 0 for v in rec.steal_ms + rec.pressure_ms)
    assert rec.pressure == Path("/proc/pressure/cpu").exists()
    assert len(rec.loadavg) == len(rec.loadavg_end) == 3
    assert probe.fd is None and not probe.workers


@pytest.mark.skipif(not Path(f"/proc/self/task/{os.getpid()}/schedstat").exists(), reason="no schedstat")
def test_cpu_wait_leaves_perfdoctors_own_threads_out_of_the_scripts_tree():
    # a `perfdoctor-*` thread spins 40 ms of each step while the training thread sleeps: its time is
    # perfdoctor's (own_ms), not the script's (tree_ms); the whole tree, for the host's other processes, has it
    go, done = threading.Event(), threading.Event()

    def spin():
        while not done.is_set():
            if go.wait(0.01):
                t = time.thread_time()
                while time.thread_time() - t < 0.04:
                    pass
                go.clear()

    burner = threading.Thread(target=spin, name="perfdoctor-test-burner", daemon=True)
    burner.start()
    probe = CpuWaitProbe(ErrorLog())
    probe.install()
    try:
        for i in range(1, 5):
            probe.begin_step()
            go.set()
            while go.is_set():
                time.sleep(0.005)
            probe.end_step(i)
        rec = probe.records()
    finally:
        done.set()
        probe.uninstall()
    assert rec is not None and len(rec.own_ms) == len(rec.tree_ms) == 4
    assert all(35 < x < 60 for x in rec.own_ms), rec.own_ms
    assert all(t < 20 for t in rec.tree_ms), rec.tree_ms  # the training thread slept
    assert rec.whole_tree_ms() == [a + b for a, b in zip(rec.tree_ms, rec.own_ms)]
    assert not probe.own


def _frame(file, line, name="forward"):
    return traceback.FrameSummary(file, line, name)


def test_compile_probe_reads_dynamo_records_step_by_step(monkeypatch):
    me = __file__
    monkeypatch.setattr("perfdoctor.capture.probes.compile.is_user_file", lambda f: f == me)
    utils = types.ModuleType("torch._dynamo.utils")
    utils.graph_break_reasons = []  # type: ignore[attr-defined]
    metrics: list = []
    utils.get_compilation_metrics = lambda: list(metrics)  # type: ignore[attr-defined]
    probe = CompileProbe(ErrorLog())
    probe.end_step(1)  # dynamo not loaded: nothing read, nothing imported
    assert probe.records(2) is None
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", utils)

    def brk(line):
        return types.SimpleNamespace(reason="Unsupported Tensor.item() call\n  Explanation: ...",
                                     user_stack=[_frame(me, 10, "main"), _frame(me, line), _frame("/torch/x.py", 5)])

    def compiled(line, secs, why=None):
        return types.SimpleNamespace(co_filename=me, co_firstlineno=line, co_name="forward",
                                     entire_frame_compile_time_s=secs, recompile_reason=why)

    utils.graph_break_reasons += [brk(22), brk(22)]  # dynamo notes a break twice when it restarts
    metrics += [compiled(20, 0.3)]
    probe.end_step(1)
    probe.end_step(2)  # nothing new
    metrics += [compiled(20, 0.2, "0/0: tensor 'x' size mismatch at index 0. expected 8, actual 9\nmore")]
    utils.graph_break_reasons += [brk(22)]
    probe.end_step(3)
    rec = probe.records(4)
    assert rec is not None
    (b,) = rec.graph_breaks
    assert (b.site.line, b.site.function, b.reason, b.steps) == (22, "forward", "Unsupported Tensor.item() call", [1, 1, 3])
    (f,) = rec.frames
    assert f.site.line == 20 and f.compiles == [[1, 300.0], [3, 200.0]]
    assert f.reasons == ["0/0: tensor 'x' size mismatch at index 0. expected 8, actual 9"]
    utils.graph_break_reasons.clear()  # torch._dynamo.reset()
    utils.graph_break_reasons.append(brk(30))
    probe.end_step(5)
    assert sorted(x.site.line for x in probe.records(6).graph_breaks) == [22, 30]


def test_anomaly_stack_time_is_the_threads_cpu_time_not_the_wall_clock(monkeypatch):
    """PD013's stack captures are timed in the training thread's CPU time: a capture that waits (here a
    sleep, on a shared machine a preemption) adds nothing; one that computes adds its work."""
    import time
    from types import SimpleNamespace

    import torch
    import torch.fx.traceback as fxtb

    from perfdoctor.capture.patches import ErrorLog
    from perfdoctor.capture.probes.anomaly import AnomalyProbe

    def waits(*a, **k):
        time.sleep(0.05)
        return []

    def works(*a, **k):
        t = time.thread_time()
        while time.thread_time() - t < 0.02:
            pass
        return []

    clock = SimpleNamespace(kind="optimizer", steps=[], pc=time.perf_counter)
    for fn, lo, hi in ((waits, 0.0, 5.0), (works, 19.0, 40.0)):
        monkeypatch.setattr(fxtb, "format_stack", fn)
        probe = AnomalyProbe(torch, clock, ErrorLog())
        probe.install()
        try:
            with torch.autograd.set_detect_anomaly(True):
                fxtb.format_stack()
        finally:
            probe.uninstall()
        assert lo <= probe.stack_ms[1] <= hi, (fn.__name__, probe.stack_ms)
