"""The top-level modules' forward calls: where the script calls its model, whether autocast was
on, the parameters' dtype and device; and each step's forward time for the step clock.

One wrapper around `torch.nn.Module.__call__` (the class's, so nothing is left on the user's
modules: `torch.save(model)`, `copy.deepcopy(model)` and pickling see exactly what a bare run
has) sees each module call made outside another one on the main thread: a top-level call. No
module hook is registered, global or per module: under `torch.compile` dynamo inlines module
hooks and would break its graphs at them, and global hooks make it compile `__call__` with its
hooks. Dynamo may still inline this wrapper (a compiled frame calling a submodule, or
`torch.compile(module)` wrapping the bound `__call__`): its first test, `is_compiling()`, is a
constant to dynamo, and from there the wrapper only calls through, so the traced graph is the one
a bare run gets. The probe's bookkeeping is keyed by `id()` and checked through a weak reference,
never stored on the module.

Each top-level call first lets the profiled window look at its time budget (`poll`), so that the
window can end inside a long step. Top-level modules are discovered during the first steps (`stop_discovery`); later top-level
calls of those modules are still counted and timed, other modules' calls just pass through.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import msgspec

from perfdoctor.capture import sites
from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.contracts.run import ForwardRecord


def is_compiling(torch: Any) -> Callable[[], bool]:
    """torch's own "is dynamo (or export) tracing now": a constant True to dynamo, False when run."""
    fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)  # torch >= 2.3
    if fn is None:
        import torch._dynamo  # torch 2.1, 2.2

        fn = torch._dynamo.is_compiling
    return fn


class ForwardProbe:
    def __init__(self, torch: Any, clock: StepClock, err: ErrorLog):
        self.torch = torch
        self.clock = clock
        self.err = err
        self.main_ident = threading.get_ident()
        self.patches = Patches()
        self.busy = False  # inside a top-level module call
        self.discover = True  # a top-level call of a module not seen yet makes a new record
        # id() -> (weak reference to the module, its record); the reference tells a reused id apart
        self.known: dict[int, tuple[weakref.ref, ForwardRecord]] = {}
        self.forward: list[ForwardRecord] = []
        self.poll: Callable[[], None] = lambda: None  # set by the coordinator: the window's time budget

    def install(self) -> None:
        probe, clock = self, self.clock
        Module = self.torch.nn.Module
        orig = Module.__call__
        compiling, get_ident, main, pc = is_compiling(self.torch), threading.get_ident, self.main_ident, clock.pc

        # the first argument must be named `self`: torch.profiler's Python tracer takes the code of
        # `Module.__call__` for the module-call frame and reads the module from its local `self`
        # (it crashes the interpreter when there is none)
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            # compiling() first: to dynamo it is True, and nothing below is traced
            if compiling() or probe.busy or get_ident() != main or clock.bwd_depth:
                # (activation checkpointing re-runs forward inside backward: not a forward call)
                return orig(self, *args, **kwargs)
            probe.poll()
            if not probe._enter(self):
                return orig(self, *args, **kwargs)
            probe.busy = True
            t0 = pc()
            try:
                return orig(self, *args, **kwargs)
            finally:
                probe.busy = False
                clock.fwd += pc() - t0

        functools.update_wrapper(__call__, orig)
        self.patches.replace(Module, "__call__", __call__)

    def uninstall(self) -> None:
        self.patches.undo()

    def _enter(self, mod: Any) -> bool:
        """Count a top-level call of `mod`; False where the module is not followed."""
        try:
            k = self.known.get(id(mod))
            if k is not None and k[0]() is mod:
                r = k[1]
            elif self.discover:
                r = self._new(mod)
            else:
                return False
            r.calls += 1
            if self._autocast(r.device):
                r.autocast_calls += 1
            return True
        except Exception as e:  # noqa: BLE001
            self.err("forward", e)
            return False

    def _new(self, mod: Any) -> ForwardRecord:
        p = next(mod.parameters(), None)
        r = ForwardRecord(site=sites.caller_site(3), module=type(mod).__name__, calls=0, autocast_calls=0,
                          param_dtype=str(p.dtype).replace("torch.", "") if p is not None else None,
                          device=p.device.type if p is not None else "cpu",
                          params=int(sum(q.numel() for q in mod.parameters())))
        self.known[id(mod)] = (weakref.ref(mod), r)
        self.forward.append(r)
        return r

    def _autocast(self, dev: str | None) -> bool:
        torch = self.torch
        try:
            return bool(torch.is_autocast_enabled(dev)) or (dev != "cuda" and bool(torch.is_autocast_enabled()))
        except TypeError:  # older torch: no device argument
            return bool(torch.is_autocast_enabled() or (dev == "cpu" and torch.is_autocast_cpu_enabled()))

    def stop_discovery(self) -> None:
        """The first steps are over: the top-level modules are known, other calls pass through."""
        self.discover = False

    def records(self) -> list[ForwardRecord]:
        return [msgspec.structs.replace(r, autocast=r.autocast_calls * 2 >= r.calls > 0) for r in self.forward]
