"""Autograd anomaly detection switched on or off (`set_detect_anomaly`, `detect_anomaly`) by the
user's own code. Torch enters anomaly mode itself (AOTAutograd traces a compiled model under
`detect_anomaly(check_nan=False)`): only a switch whose direct caller is a user file counts, so the
record's site is the line that switched it.

What anomaly mode costs in the forward: for every autograd node it creates, torch calls
`torch.fx.traceback.format_stack()` (from C++, through the module's attribute) to keep the Python
stack; the probe times those calls while anomaly mode is on, step by step (`anomaly_stack_ms`, the first part
of PD013's saving; the backward's NaN checks are the trace's, facts/trace/anomaly.py). It takes the
calling thread's CPU time, not the wall clock: on a shared machine a capture preempted halfway would
count the other processes' time as anomaly mode's (at load average 6-7 the wall clock gave 2.2 ms a step
on PD013's sample, where verify measured 1.25 ms saved by removing the switch)."""

from __future__ import annotations

import sys
import time
from typing import Any

from perfdoctor.capture import sites
from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.contracts.run import AnomalyRecord
from perfdoctor.usercode import is_user_file


class AnomalyProbe:
    def __init__(self, torch: Any, clock: StepClock, err: ErrorLog):
        self.torch = torch
        self.clock = clock
        self.err = err
        self.patches = Patches()
        self.switches: list[AnomalyRecord] = []
        self.stack_ms: dict[int, float] = {}  # step -> ms in anomaly mode's stack captures

    def install(self) -> None:
        import torch.autograd.anomaly_mode  # noqa: F401 - make the submodule an attribute

        probe = self
        am = self.torch.autograd.anomaly_mode
        for cls, fixed in ((am.set_detect_anomaly, None), (am.detect_anomaly, True)):
            orig = cls.__init__

            def init(obj: Any, *args: Any, _orig: Any = orig, _fixed: Any = fixed, **kwargs: Any) -> None:
                _orig(obj, *args, **kwargs)
                try:
                    caller = sys._getframe(1)  # the frame that constructed the switch
                    if not is_user_file(caller.f_code.co_filename):
                        return  # torch's own (AOTAutograd, a library): not the user's switch
                    on = _fixed if _fixed is not None else bool(args[0] if args else kwargs.get("mode", True))
                    probe.switches.append(AnomalyRecord(site=sites.site_of(caller), enabled=on))
                except Exception as e:  # noqa: BLE001
                    probe.err("anomaly", e)

            self.patches.replace(cls, "__init__", init)
        self._time_stacks()

    def _time_stacks(self) -> None:
        try:
            import torch.fx.traceback as fxtb
        except ImportError:  # an older torch: no number, the rule says so
            return
        probe, clock, enabled = self, self.clock, self.torch.is_anomaly_enabled
        orig, cpu_ns = fxtb.format_stack, time.thread_time_ns

        def format_stack(*args: Any, **kwargs: Any) -> Any:
            if not enabled() or clock.kind is None:
                return orig(*args, **kwargs)
            t = cpu_ns()
            try:
                return orig(*args, **kwargs)
            finally:
                i = len(clock.steps) + 1
                probe.stack_ms[i] = probe.stack_ms.get(i, 0.0) + (cpu_ns() - t) / 1e6

        self.patches.replace(fxtb, "format_stack", format_stack)

    def stack_records(self) -> list[list[float]]:
        return [[i, round(ms, 4)] for i, ms in sorted(self.stack_ms.items())]

    def uninstall(self) -> None:
        self.patches.undo()

    def records(self) -> list[AnomalyRecord]:
        return list(self.switches)
