"""What a probe changed in torch (or os), so that it can put it back; and the probes' error log."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

MAX_ERRORS = 20


def tracing(torch: Any) -> Callable[[], bool]:
    """A function true while torch traces or exports the program: then a probe's wrapper only calls
    the original and does nothing observable (no tensor read, no record, no hook). Dynamo
    (torch.compile, torch.export, strict or not: `torch.compiler.is_compiling()`, a constant True to
    dynamo, tested first so that dynamo traces nothing after it), TorchScript's tracer (`torch.jit.trace`,
    TensorBoard's `add_graph`: it runs the forward twice and compares the graphs, and a probe's work at
    a line's first call differed between the two) and torch.fx's symbolic tracing."""
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)  # torch >= 2.3
    if compiling is None:
        import torch._dynamo  # torch 2.1, 2.2

        compiling = torch._dynamo.is_compiling
    jit_state = getattr(torch._C, "_get_tracing_state", None) or (lambda: None)
    fx = getattr(getattr(torch, "fx", None), "_symbolic_trace", None)

    def now() -> bool:
        return bool(compiling() or jit_state() is not None or getattr(fx, "_is_fx_tracing_flag", False))

    return now


# PySequenceMethods' slots a class's `__getitem__` / `__setitem__` also fill (sq_item, sq_ass_item)
_SEQUENCE_SLOT = {"__getitem__": 3, "__setitem__": 5}


def _sequence_slot(owner: Any, name: str) -> Any:
    """The sequence slot that setting `name` on the heap type `owner` fills, as a ctypes pointer; None
    where it cannot be read safely (not CPython with the GIL, not a heap type, or a type layout this
    code does not know: its tp_basicsize and tp_itemsize are checked where they should be).

    A Python `__getitem__` set on a class gives it `sq_item` as well as `mp_subscript`, so
    `PySequence_Check` becomes true for its instances, and deleting it again leaves `sq_item` set. On
    `torch.Tensor` that changes the program: torch's tensor constructors take a tensor in a list for a
    sequence, and `torch.tensor([loss_a, loss_b])` of 0-d tensors raises "len() of a 0-d tensor"."""
    import ctypes
    import sys
    import sysconfig

    slot = _SEQUENCE_SLOT.get(name)
    if (slot is None or sys.implementation.name != "cpython" or sysconfig.get_config_var("Py_GIL_DISABLED")
            or not isinstance(owner, type) or not owner.__flags__ & (1 << 9)):  # Py_TPFLAGS_HEAPTYPE
        return None
    word, base = ctypes.sizeof(ctypes.c_void_p), id(owner)
    # PyTypeObject: ob_refcnt, ob_type, ob_size, tp_name, tp_basicsize, tp_itemsize, ..., tp_as_sequence (13th)
    if (ctypes.c_ssize_t.from_address(base + 4 * word).value != owner.__basicsize__
            or ctypes.c_ssize_t.from_address(base + 5 * word).value != owner.__itemsize__):
        return None
    methods = ctypes.c_void_p.from_address(base + 13 * word).value
    return ctypes.c_void_p.from_address(methods + slot * word) if methods else None


class Patches:
    """Attributes one probe replaced and hooks it registered, undone in reverse order. A class's
    `__getitem__` / `__setitem__` replaced with a Python function leaves the class's sequence slot as
    it was (empty on `torch.Tensor`: `_sequence_slot`), while replaced and after."""

    def __init__(self) -> None:
        self._undo: list[Any] = []

    def replace(self, owner: Any, name: str, new: Any) -> Any:
        """Set `owner.name` to `new`; return what it was. A wrapper function takes the original's name,
        doc and signature (`functools.update_wrapper`: `__wrapped__`), so that what reads them sees
        the bare function: Lightning re-creates a DataLoader from `inspect.signature(__init__)`'s
        parameters, and a wrapper's `(loader, *args, **kwargs)` made it ask for a `loader` attribute."""
        had = name in vars(owner)
        old = getattr(owner, name)
        if isinstance(new, types.FunctionType) and callable(old):
            functools.update_wrapper(new, old)
        slot = _sequence_slot(owner, name)
        empty = slot is not None and not slot.value
        setattr(owner, name, new)
        if empty:
            slot.value = None
        self._undo.append((owner, name, old, had, slot if empty else None))
        return old

    def hook(self, handle: Any) -> Any:
        """Keep a hook's removable handle."""
        self._undo.append(handle)
        return handle

    def undo(self) -> None:
        for u in reversed(self._undo):
            if isinstance(u, tuple):
                owner, name, old, had, slot = u
                if had:
                    setattr(owner, name, old)
                else:
                    try:
                        delattr(owner, name)
                    except AttributeError:
                        pass
                if slot is not None:
                    slot.value = None
            else:
                u.remove()
        self._undo = []


class ErrorLog:
    """Probe errors: the first few are kept for meta.json, none is raised into the user's script."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def __call__(self, where: str, e: BaseException) -> None:
        if len(self.items) < MAX_ERRORS:
            self.items.append(f"{where}: {type(e).__name__}: {e}")
