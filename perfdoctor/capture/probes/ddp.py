"""DistributedDataParallel: how each DDP was built, and what it did on every step (PD031-PD033).

- Construction (`DistributedDataParallel.__init__`): the call site, `find_unused_parameters`,
  `gradient_as_bucket_view` and `static_graph` as the object holds them, its trainable parameters
  and their bytes.
- Forward (`_post_forward`, where DDP decides whether the coming backward all-reduces): the passes
  that will synchronise (grad mode on, not inside `no_sync()`) per step, and with
  `find_unused_parameters=True` the time `_post_forward` took: the walk of the autograd graph from
  the outputs that looks for parameters the forward did not use.
- Backward (`torch.autograd.backward`): backward passes per step while a DDP is alive, and the user
  line that calls the first one (PD032 names it).
- Before each optimizer step: with `find_unused_parameters=True`, whether every parameter was used on
  every rank, from the reducer's used map (all-reduced by DDP itself: the count of ranks that used
  each parameter); the count of steps on which one was not stays on the device (no host sync) and
  is read when the records are written. On the first steps and every 50th, DDP's own timing of its
  backward communication (`_get_ddp_logging_data`, sampled by DDP on its first iterations).

Nothing is kept on the user's objects: the probe patches the DDP class (undone by `uninstall()`),
and its bookkeeping is keyed by `id()` checked through a weak reference. Everything is a no-op while
dynamo compiles.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from perfdoctor.capture import sites
from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.patches import ErrorLog, Patches, tracing
from perfdoctor.contracts.run import DdpRecord, Site
from perfdoctor.usercode import is_user_file

LOG_STEPS = 12  # DDP's own comm timing is read on the first steps (DDP samples its first iterations) ...
LOG_EVERY = 50  # ... and every this many steps after


class _Ddp:
    """The probe's bookkeeping of one DDP object."""

    __slots__ = ("ref", "rec", "by_step", "unused", "checked", "checks")

    def __init__(self, ref: weakref.ref, rec: DdpRecord):
        self.ref = ref
        self.rec = rec
        self.by_step: dict[int, list[float]] = {}  # step -> [synchronised forwards, traversal ms]
        self.unused: Any = 0  # steps with a parameter some rank did not use (a device tensor once counted)
        self.checked = 0  # steps whose used map was read
        self.checks = False  # find_unused_parameters without static_graph: the used map means something


class DdpProbe:
    def __init__(self, torch: Any, clock: StepClock, err: ErrorLog):
        self.torch = torch
        self.clock = clock
        self.err = err
        self.patches = Patches()
        self.ddps: dict[int, _Ddp] = {}
        self.backwards: dict[int, int] = {}  # step -> backward passes while a DDP was alive
        self.backward_site: Site | None = None
        self.compiling = tracing(torch)

    def _live(self, obj: Any) -> _Ddp | None:
        d = self.ddps.get(id(obj))
        return d if d is not None and d.ref() is obj else None

    def _step(self) -> int:
        return len(self.clock.steps) + 1

    def install(self) -> None:
        torch, probe, clock, compiling = self.torch, self, self.clock, self.compiling
        ddp_cls = torch.nn.parallel.DistributedDataParallel
        if not hasattr(ddp_cls, "_post_forward"):  # DDP's forward in one piece (torch before 2.0)
            return
        orig_init, orig_post = ddp_cls.__init__, ddp_cls._post_forward

        def init(obj: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(obj, *args, **kwargs)
            try:
                probe._built(obj, sys._getframe(1))
            except Exception as e:  # noqa: BLE001
                probe.err("ddp", e)

        def post_forward(obj: Any, output: Any) -> Any:
            if compiling():
                return orig_post(obj, output)
            d = probe._live(obj)
            synced = d is not None and torch.is_grad_enabled() and obj.require_backward_grad_sync
            t = clock.pc()
            out = orig_post(obj, output)
            if synced and d is not None:
                row = d.by_step.setdefault(probe._step(), [0, 0.0])
                row[0] += 1
                if d.checks:
                    row[1] += (clock.pc() - t) * 1e3
            return out

        orig_backward = torch.autograd.backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            out = orig_backward(*args, **kwargs)
            if probe.ddps and not compiling():
                i = probe._step()
                probe.backwards[i] = probe.backwards.get(i, 0) + 1
                if probe.backward_site is None:
                    t1 = clock.pc()
                    probe.backward_site = sites.caller_site()
                    clock.exclude(t1)
            return out

        self.patches.replace(ddp_cls, "__init__", init)
        self.patches.replace(ddp_cls, "_post_forward", post_forward)
        self.patches.replace(torch.autograd, "backward", backward)
        import torch.optim.optimizer as opt_mod

        self.patches.hook(opt_mod.register_optimizer_step_pre_hook(self._before_optimizer))

    def _built(self, obj: Any, caller: Any) -> None:
        """Record a DDP just built; `caller`: the frame that built it (the user's, or a framework's)."""
        params = [p for p in obj.module.parameters() if p.requires_grad]
        pg = getattr(obj, "process_group", None)
        rec = DdpRecord(site=sites.caller_site(2), module=type(obj.module).__name__,
                        find_unused_parameters=bool(obj.find_unused_parameters),
                        gradient_as_bucket_view=bool(obj.gradient_as_bucket_view),
                        static_graph=bool(obj.static_graph), params=sum(p.numel() for p in params),
                        grad_bytes=sum(p.numel() * p.element_size() for p in params),
                        world_size=int(pg.size()) if pg is not None else 0,
                        built_by=None if is_user_file(caller.f_code.co_filename)
                        else str(caller.f_globals.get("__name__") or "?").split(".", 1)[0])
        d = _Ddp(weakref.ref(obj), rec)
        d.checks = rec.find_unused_parameters and not rec.static_graph
        self.ddps[id(obj)] = d

    def _before_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.ddps or self.compiling():
            return
        t1 = self.clock.pc()
        i = self._step()
        try:
            for d in self.ddps.values():
                obj = d.ref()
                if obj is None or not d.by_step.get(i, (0,))[0]:
                    continue  # gone, or no synchronised backward on this step
                if d.checks:
                    used = obj.reducer._get_local_used_map()
                    if used.numel():
                        d.unused = d.unused + (used < d.rec.world_size).any().to(self.torch.int32)
                        d.checked += 1
                if i <= LOG_STEPS or i % LOG_EVERY == 0:
                    self._comm_timing(obj, d.rec)
        except Exception as e:  # noqa: BLE001
            self.err("ddp", e)
        self.clock.exclude(t1)

    @staticmethod
    def _comm_timing(obj: Any, rec: DdpRecord) -> None:
        """DDP's own average time of its backward all-reduces (from the first bucket's launch to the
        last one's end) and the part of it that backward compute overlapped, over the iterations DDP
        sampled."""
        data = obj._get_ddp_logging_data()
        comm = data.get("avg_backward_comm_time")
        if isinstance(comm, int) and comm > 0:
            rec.comm_ms = round(comm / 1e6, 4)
            over = data.get("avg_backward_compute_comm_overlap_time")
            rec.comm_overlap_ms = round(over / 1e6, 4) if isinstance(over, int) else None

    def uninstall(self) -> None:
        self.patches.undo()

    def records(self) -> list[DdpRecord]:
        out = []
        for d in self.ddps.values():
            rec = d.rec
            rec.steps_checked = d.checked
            rec.unused_steps = int(d.unused) if d.checked else 0
            rec.by_step = [[i, n, round(ms, 4), self.backwards.get(i, 0)] for i, (n, ms) in sorted(d.by_step.items())]
            rec.backward_site = self.backward_site
            out.append(rec)
        return out
