"""`gc.collect()` calls, per call site: how many, and the time they took on each step (PD027).

A full collection walks every container object the process holds: with a model, a dataset and an
optimizer loaded that is tens of milliseconds or more, paid on every step that calls it.
"""

from __future__ import annotations

import gc
from typing import Any

from perfdoctor.capture import sites
from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.contracts.run import GcCallRecord


class GcCallProbe:
    def __init__(self, clock: StepClock, err: ErrorLog):
        self.clock = clock
        self.err = err
        self.patches = Patches()
        self.calls: dict[tuple, GcCallRecord] = {}
        self.by_step: dict[tuple, dict[int, list[float]]] = {}  # site key -> step -> [ms, calls]

    def install(self) -> None:
        probe, clock = self, self.clock
        orig = gc.collect

        def collect(*args: Any, **kwargs: Any) -> int:
            t = clock.pc()
            try:
                return orig(*args, **kwargs)
            finally:
                dt = clock.pc() - t
                t1 = clock.pc()
                try:
                    probe._on_call(dt)
                except Exception as e:  # noqa: BLE001
                    probe.err("gc_calls", e)
                clock.exclude(t1)  # the site lookup is perfdoctor's, not the step's

        self.patches.replace(gc, "collect", collect)

    def _on_call(self, dt: float) -> None:
        site = sites.caller_site(2)
        key = (site.file, site.line) if site else ("?", 0)
        r = self.calls.get(key)
        if r is None:
            r = self.calls[key] = GcCallRecord(site=site, calls=0, calls_in_steps=0)
            self.by_step[key] = {}
        r.calls += 1
        if self.clock.kind is not None:  # inside the training loop: the step being timed now
            r.calls_in_steps += 1
            i = len(self.clock.steps) + 1
            cur = self.by_step[key].setdefault(i, [0.0, 0])
            cur[0] += dt * 1e3
            cur[1] += 1

    def uninstall(self) -> None:
        self.patches.undo()

    def records(self) -> list[GcCallRecord]:
        out = []
        for key, r in self.calls.items():
            r.ms_by_step = [[i, round(ms, 4), n] for i, (ms, n) in sorted(self.by_step[key].items())]
            out.append(r)
        return out
