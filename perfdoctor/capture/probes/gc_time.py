"""Time in Python's garbage collector per step, automatic collections and explicit ones alike
(`gc.callbacks`, removed by `uninstall()`): one rank of a job whose collections run long on its steps
is a straggler for them (the rank table's `gc_ms`, a cause `facts.ranks` can name). PD027 times
the explicit `gc.collect()` calls at their lines (`gc_calls.py`). The part of it inside forward,
backward and the optimizer step is kept apart: it is in those parts' time, and the rank table takes it
out of the rank's compute."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.patches import ErrorLog
from perfdoctor.contracts.run import GcTimeRecord


class GcTimeProbe:
    def __init__(self, clock: StepClock, err: ErrorLog, in_forward: Callable[[], bool]):
        self.clock = clock
        self.err = err
        self.in_forward = in_forward  # the forward probe is inside a top-level module call
        self.t0: float | None = None
        self.by_step: dict[int, list[float]] = {}  # step -> [ms in collections, collections, ms of it in compute]
        self.installed = False

    def install(self) -> None:
        gc.callbacks.append(self._callback)
        self.installed = True

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.t0 = self.clock.pc()
            return
        t0, self.t0 = self.t0, None
        if t0 is None or self.clock.kind is None:
            return  # not on a training step
        clock = self.clock
        ms = (clock.pc() - t0) * 1e3
        row = self.by_step.setdefault(len(clock.steps) + 1, [0.0, 0, 0.0])
        row[0] += ms
        row[1] += 1
        if clock.bwd_depth or clock.opt_depth or self.in_forward():
            row[2] += ms

    def uninstall(self) -> None:
        if self.installed:
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:
                pass
            self.installed = False

    def records(self) -> GcTimeRecord:
        return GcTimeRecord(ms_by_step=[[i, round(ms, 4), n, round(inner, 4)]
                                        for i, (ms, n, inner) in sorted(self.by_step.items())])
