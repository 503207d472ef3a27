"""Time in Python's garbage collector per step, automatic collections and explicit ones alike
(`gc.callbacks`, removed by `uninstall()`): one rank of a job whose collections run long on its steps
is a straggler for them (the rank table's `gc_ms`, a cause `facts.trace.ranks` can name). PD027 times
the explicit `gc.collect()` calls at their lines (`gc_calls.py`)."""

from __future__ import annotations

import gc
from typing import Any

from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.patches import ErrorLog
from perfdoctor.contracts.run import GcTimeRecord


class GcTimeProbe:
    def __init__(self, clock: StepClock, err: ErrorLog):
        self.clock = clock
        self.err = err
        self.t0: float | None = None
        self.by_step: dict[int, list[float]] = {}  # step -> [ms in collections, collections]
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
        row = self.by_step.setdefault(len(self.clock.steps) + 1, [0.0, 0])
        row[0] += (self.clock.pc() - t0) * 1e3
        row[1] += 1

    def uninstall(self) -> None:
        if self.installed:
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:
                pass
            self.installed = False

    def records(self) -> GcTimeRecord:
        return GcTimeRecord(ms_by_step=[[i, round(ms, 4), n] for i, (ms, n) in sorted(self.by_step.items())])
