"""`torch.cuda.empty_cache()` calls, per call site: how many, and how many inside the steps (after
the first step's end and before the last's)."""

from __future__ import annotations

from typing import Any

from perfdoctor.capture import sites
from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.contracts.run import EmptyCacheRecord


class EmptyCacheProbe:
    def __init__(self, torch: Any, clock: StepClock, err: ErrorLog):
        self.torch = torch
        self.clock = clock
        self.err = err
        self.patches = Patches()
        self.calls: dict[tuple, EmptyCacheRecord] = {}
        # per call site, the calls by how many steps had ended when they were made
        self.by_step: dict[tuple, dict[int, int]] = {}

    def install(self) -> None:
        torch, probe = self.torch, self
        orig = torch.cuda.empty_cache

        def empty_cache() -> None:
            try:
                site = sites.caller_site()
                key = (site.file, site.line) if site else ("?", 0)
                r = probe.calls.get(key)
                if r is None:
                    r = probe.calls[key] = EmptyCacheRecord(site=site, calls=0, calls_in_steps=0)
                r.calls += 1
                by = probe.by_step.setdefault(key, {})
                n = len(probe.clock.steps)
                by[n] = by.get(n, 0) + 1
            except Exception as e:  # noqa: BLE001
                probe.err("empty_cache", e)
            return orig()

        # both names the function is reachable by
        self.patches.replace(torch.cuda, "empty_cache", empty_cache)
        if getattr(torch.cuda, "memory", None) is not None and hasattr(torch.cuda.memory, "empty_cache"):
            self.patches.replace(torch.cuda.memory, "empty_cache", empty_cache)

    def uninstall(self) -> None:
        self.patches.undo()

    def records(self) -> list[EmptyCacheRecord]:
        """`calls_in_steps`: the calls made inside a step that ended, after the first: not those
        before it (set-up) nor after the last step's end (a library's teardown at the end of fit)."""
        done = len(self.clock.steps)
        for key, r in self.calls.items():
            r.calls_in_steps = sum(c for n, c in self.by_step.get(key, {}).items() if 1 <= n < done)
        return list(self.calls.values())
