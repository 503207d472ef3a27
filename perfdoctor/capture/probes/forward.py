"""The top-level modules' forward calls: where the script calls its model, whether autocast was
on, the parameters' dtype and device; and each step's forward time for the step clock.

Global forward hooks find the top-level modules during the first steps (a slow path for every
module call), then hooks on those modules alone take over (`to_roots`).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import msgspec

from perfdoctor.capture import sites
from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.patches import ErrorLog
from perfdoctor.contracts.run import ForwardRecord


class ForwardProbe:
    def __init__(self, torch: Any, clock: StepClock, err: ErrorLog):
        self.torch = torch
        self.clock = clock
        self.err = err
        self.main_ident = threading.get_ident()
        self.depth = 0
        self.t0 = 0.0
        self.forward: dict[int, ForwardRecord] = {}
        self.roots: dict[int, Any] = {}  # id() -> weakref of the top-level modules
        self._handles: list[Any] = []

    def install(self) -> None:
        mm = self.torch.nn.modules.module
        self._handles = [mm.register_module_forward_pre_hook(self._pre)]
        try:
            self._handles.append(mm.register_module_forward_hook(self._post, always_call=True))
        except TypeError:  # torch < 2.1
            self._handles.append(mm.register_module_forward_hook(self._post))

    def uninstall(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _pre(self, mod: Any, args: Any) -> None:
        if threading.get_ident() != self.main_ident:
            return
        if self.depth:
            self.depth += 1
            return
        if self.clock.bwd_depth:  # activation checkpointing re-runs forward inside backward
            return
        self.depth = 1
        self.t0 = self.clock.pc()
        try:
            r = self.forward.get(id(mod))
            if r is None:
                r = self._new(mod)
            r.calls += 1
            if self._autocast(r.device):
                r.autocast_calls += 1
        except Exception as e:  # noqa: BLE001
            self.err("forward", e)

    def _post(self, mod: Any, args: Any, out: Any) -> None:
        if self.depth == 0 or threading.get_ident() != self.main_ident:
            return
        self.depth -= 1
        if self.depth == 0:
            self.clock.fwd += self.clock.pc() - self.t0

    def _new(self, mod: Any) -> ForwardRecord:
        p = next(mod.parameters(), None)
        r = ForwardRecord(site=sites.caller_site(2), module=type(mod).__name__, calls=0, autocast_calls=0,
                          param_dtype=str(p.dtype).replace("torch.", "") if p is not None else None,
                          device=p.device.type if p is not None else "cpu",
                          params=int(sum(q.numel() for q in mod.parameters())))
        self.forward[id(mod)] = r
        self.roots[id(mod)] = weakref.ref(mod)
        return r

    def _autocast(self, dev: str | None) -> bool:
        torch = self.torch
        try:
            return bool(torch.is_autocast_enabled(dev)) or (dev != "cuda" and bool(torch.is_autocast_enabled()))
        except TypeError:  # older torch: no device argument
            return bool(torch.is_autocast_enabled() or (dev == "cpu" and torch.is_autocast_cpu_enabled()))

    def to_roots(self) -> None:
        """Swap the global forward hooks (slow path for every module) for hooks on the roots only."""
        self.uninstall()
        for ref in self.roots.values():
            m = ref()
            if m is None:
                continue
            self._handles.append(m.register_forward_pre_hook(self._pre))
            try:
                self._handles.append(m.register_forward_hook(self._post, always_call=True))
            except TypeError:
                self._handles.append(m.register_forward_hook(self._post))
        self.depth = 0

    def end_step(self) -> None:
        self.depth = 0

    def records(self) -> list[ForwardRecord]:
        return [msgspec.structs.replace(r, autocast=r.autocast_calls * 2 >= r.calls > 0)
                for r in self.forward.values()]
