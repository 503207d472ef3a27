"""`torch.cuda.empty_cache()` calls, per call site: how many, and how many inside the steps."""

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
                if probe.clock.steps:
                    r.calls_in_steps += 1
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
        return list(self.calls.values())
