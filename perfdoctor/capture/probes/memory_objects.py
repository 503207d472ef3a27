"""What the model's training state takes in memory, exactly, from the objects the run saw: the bytes of
the parameters each optimizer updates, of their gradients and of the optimizer's state (Adam's two
moments, momentum buffers...), by dtype and device type.

Read once per optimizer, at the end of its second step (its state exists after the first; the
gradients are still there after `step()`), in a global optimizer step post hook (removed by
`uninstall()`). Storages are counted once however many tensors view them and however many optimizers
hold them (shared, tied or viewed parameters are not counted twice). Nothing is kept on the optimizer:
optimizers are tracked by `id()` through weak references.

Cost: one pass over the optimizer's parameters and state, once.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any

from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.contracts.run import OptimizerMemory

READ_AT_STEP = 2  # the optimizer's own step at which its memory is read
MAX_OPTIMIZERS = 16


def _key(t: Any) -> tuple[int, int]:
    """The storage a tensor views: (data pointer, device index), one per storage."""
    try:
        st = t.untyped_storage()
        return int(st.data_ptr()), hash(str(t.device))
    except Exception:  # noqa: BLE001  # a tensor subclass without a plain storage: its own identity
        return id(t), 0


def _nbytes(t: Any) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001
        return int(t.numel() * t.element_size())


class MemoryObjectsProbe:
    def __init__(self, torch: Any, err: ErrorLog):
        self.torch = torch
        self.err = err
        self.patches = Patches()
        self.steps: dict[int, int] = {}  # id(optimizer) -> its steps so far
        self.refs: dict[int, weakref.ref] = {}
        self.seen: set[tuple[int, int]] = set()  # storages counted already
        self.found: list[OptimizerMemory] = []

    def install(self) -> None:
        opt_mod = importlib.import_module("torch.optim.optimizer")
        if hasattr(opt_mod, "register_optimizer_step_post_hook"):
            self.patches.hook(opt_mod.register_optimizer_step_post_hook(self._post))

    def uninstall(self) -> None:
        self.patches.undo()

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            k = id(optimizer)
            ref = self.refs.get(k)
            if ref is None or ref() is not optimizer:  # a new optimizer (or a new one at a reused id)
                if len(self.refs) >= MAX_OPTIMIZERS:
                    return
                self.refs[k] = weakref.ref(optimizer)
                self.steps[k] = 0
            self.steps[k] += 1
            if self.steps[k] == READ_AT_STEP:
                self.found.append(self._read(optimizer))
        except Exception as e:  # noqa: BLE001
            self.err("memory_objects", e)

    def _count(self, t: Any, into: dict[str, int]) -> None:
        if not isinstance(t, self.torch.Tensor):
            return
        key = _key(t)
        if key in self.seen:
            return
        self.seen.add(key)
        name = f"{str(t.dtype).removeprefix('torch.')}@{t.device.type}"
        into[name] = into.get(name, 0) + _nbytes(t)

    def _read(self, optimizer: Any) -> OptimizerMemory:
        params: dict[str, int] = {}
        grads: dict[str, int] = {}
        state: dict[str, int] = {}
        n = 0
        for group in optimizer.param_groups:
            for p in group.get("params", []):
                n += 1
                self._count(p, params)
                if getattr(p, "grad", None) is not None:
                    self._count(p.grad, grads)
        for per_param in getattr(optimizer, "state", {}).values():
            if isinstance(per_param, dict):
                for v in per_param.values():
                    if isinstance(v, self.torch.Tensor) and v.dim() > 0:  # step counters are 0-d: no memory
                        self._count(v, state)
        return OptimizerMemory(optimizer=type(optimizer).__name__, step=READ_AT_STEP, params=n,
                               params_bytes=params, grads_bytes=grads, state_bytes=state)

    def records(self) -> list[OptimizerMemory]:
        return list(self.found)
