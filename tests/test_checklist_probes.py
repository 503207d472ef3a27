"""The capture probes of the checklist rules, driven by a stand-in step clock (no torch): gc.collect()
calls per site and step (PD027), the run-long stack sampler (PD020), the DataLoader start-up times
(PD015 is covered end to end by tests/test_e2e_samples.py)."""

from __future__ import annotations

import gc
import time

from perfdoctor.capture.patches import ErrorLog
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
