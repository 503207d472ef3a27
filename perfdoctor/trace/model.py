"""The compact in-memory model of one torch.profiler trace.

Events are stored column-wise in `array.array`s (one entry per kept event) with an interned
string table for names, so that a 500 MB trace costs tens of MB of RAM, not GBs. Only complete
("X") events of the categories analysis uses, plus memory instant events, are kept; flow events,
metadata and everything in `args` that no fact needs are dropped while decoding.
"""

from __future__ import annotations

import gc
from array import array
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import add
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

# Event kinds (the `kind` column). Both the torch 2.x and the legacy PyTorch 1.9 category
# names map onto these.
CPU_OP, USER_ANN, GPU_ANN, PYFUNC, RUNTIME, DRIVER, KERNEL, MEMCPY, MEMSET, MEMORY = range(10)
KIND_NAMES = ("cpu_op", "user_annotation", "gpu_user_annotation", "python_function", "cuda_runtime",
              "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset", "memory")
GPU_KINDS = (KERNEL, MEMCPY, MEMSET)

CATEGORY_KIND = {
    "cpu_op": CPU_OP, "operator": CPU_OP,
    "user_annotation": USER_ANN,
    "gpu_user_annotation": GPU_ANN,
    "python_function": PYFUNC,
    "cuda_runtime": RUNTIME, "runtime": RUNTIME,
    "cuda_driver": DRIVER, "driver": DRIVER,
    "kernel": KERNEL,
    "gpu_memcpy": MEMCPY, "memcpy": MEMCPY,
    "gpu_memset": MEMSET, "memset": MEMSET,
    "cpu_instant_event": MEMORY,
}


def _json_value(b: bytes) -> Any:
    try:
        return msgspec.json.decode(b) if b else None
    except msgspec.DecodeError:
        return None


@contextmanager
def gc_paused():
    """Pause the cyclic garbage collector. Loading and measuring a big trace allocates millions of
    short-lived objects and no cycles; with the collector on, its repeated passes over everything
    still alive make the work grow faster than the trace (3x slower on a 500 MB trace)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Operands(NamedTuple):
    """An op's recorded operands: their types and dims (parsed), their strides (raw JSON, parsed on demand)."""
    types: list
    dims: list
    strides_json: bytes

    @property
    def sparse(self) -> bool:
        """Whether an operand is a sparse tensor (COO, CSR): torch.profiler records a tensor's dims and,
        for a strided one, its strides; a sparse tensor has dims and no strides ([]). False where the
        trace has no "Input Strides" (older profilers) or the shapes were not kept."""
        if not self.strides_json or not self.dims:
            return False
        strides = _json_value(self.strides_json)
        if not isinstance(strides, list):
            return False
        return any(isinstance(d, list) and d and k < len(strides) and strides[k] == [] for k, d in enumerate(self.dims))


@dataclass
class Trace:
    """One trace file (one rank). Per-event columns are parallel arrays indexed by event number."""

    path: Path
    rank: int = 0
    rank_source: str = "order"  # "distributedInfo", "file name" or "order"
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    distributed_info: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # small top-level scalars (schemaVersion, ...)
    strings: list[str] = field(default_factory=list)  # interned names (event names, tracks)

    kind: array = field(default_factory=lambda: array("b"))
    name: array = field(default_factory=lambda: array("i"))  # index into `strings`
    ts: array = field(default_factory=lambda: array("d"))  # microseconds
    dur: array = field(default_factory=lambda: array("d"))  # microseconds
    track: array = field(default_factory=lambda: array("i"))  # index into `strings`: "pid/tid"
    ext: array = field(default_factory=lambda: array("q"))  # External id; Python id for PYFUNC; Addr for MEMORY; -1
    # correlation; Python parent id for PYFUNC; the allocator's "Total Allocated" for MEMORY; -1
    corr: array = field(default_factory=lambda: array("q"))
    stream: array = field(default_factory=lambda: array("i"))  # GPU stream; "Device Type" for MEMORY (0 CPU, 1 CUDA); -1
    device: array = field(default_factory=lambda: array("i"))  # GPU device, -1 for CPU events
    nbytes: array = field(default_factory=lambda: array("q"))  # memcpy/memset bytes, memory event bytes

    # Sparse per-event args, keyed by event index (only the events that carry them).
    shapes: dict[int, tuple[bytes, bytes, bytes]] = field(default_factory=dict)  # raw JSON (types, dims, strides): see shape()
    call_stack: dict[int, int] = field(default_factory=dict)  # legacy "Call stack" (string index)
    # autograd's sequence number of an operator (sparse): a forward op and the backward node
    # (`autograd::engine::evaluate_function: ...`) made from it share it
    seq: dict[int, int] = field(default_factory=dict)
    comm: dict[int, dict[str, Any]] = field(default_factory=dict)  # record_param_comms sizes

    # Steps, filled by `trace.steps.find_steps` when the trace is loaded.
    steps: list[tuple[str, float, float]] = field(default_factory=list)  # (name, start, end) µs
    cpu_steps: list[tuple[float, float]] = field(default_factory=list)  # the steps' CPU-side spans µs
    step_source: str = "whole-run"  # "profiler-step", "annotation" or "whole-run"
    dropped_last_step: bool = False
    # events the loader dropped or repaired, by reason (a note in every format says so)
    dropped: dict[str, int] = field(default_factory=dict)
    _by_kind: list[array] | None = field(default=None, repr=False, compare=False)  # see indices()

    def __len__(self) -> int:
        return len(self.kind)

    def name_of(self, i: int) -> str:
        return self.strings[self.name[i]]

    def track_of(self, i: int) -> str:
        return self.strings[self.track[i]]

    def shape(self, i: int) -> Operands:
        """The operands of event i (Input type, Input Dims, the raw Input Strides), for the ops whose
        shapes the loader kept (matmuls, convs, collectives; see loader._SHAPE_WORDS); empty for the others."""
        raw = self.shapes.get(i)
        if raw is None:
            return Operands([], [], b"")
        types, dims = (_json_value(b) for b in raw[:2])
        return Operands(types if isinstance(types, list) else [], dims if isinstance(dims, list) else [], raw[2])

    def indices(self, *kinds: int) -> list[int]:
        """Indices of the events of these kinds, in file order. One pass over the trace files the
        events by kind the first time; after that this costs only the events asked for."""
        by = self._kinds()
        if len(kinds) == 1:
            return by[kinds[0]].tolist()
        return sorted([i for k in set(kinds) for i in by[k]])  # timsort merges the sorted runs: linear

    def count(self, kind: int) -> int:
        return len(self._kinds()[kind])

    def _kinds(self) -> list[array]:
        if self._by_kind is None:
            by: list[list[int]] = [[] for _ in KIND_NAMES]
            for i, k in enumerate(self.kind):
                by[k].append(i)
            self._by_kind = [array("i", lst) for lst in by]
        return self._by_kind

    def names_where(self, pred) -> set[int]:
        """Indices into `strings` of the names for which pred(name) is true (strings are few)."""
        return {j for j, s in enumerate(self.strings) if pred(s)}

    @property
    def device_type(self) -> str:
        """"cuda", "rocm" or "cpu", from the device properties and the runtime calls."""
        if any("hip" in self.strings[self.name[i]][:4] for i in self._first_of(RUNTIME, 200)):
            return "rocm"
        props = " ".join(str(p.get("name", "")) for p in self.device_properties)
        if "AMD" in props or "Instinct" in props or "roctracer_version" in self.meta:
            return "rocm"
        if self.device_properties or self.has_gpu_events:
            return "cuda"
        return "cpu"

    def _first_of(self, kind: int, n: int) -> list[int]:
        return list(self._kinds()[kind][:n])

    @property
    def has_gpu_events(self) -> bool:
        return any(self.count(k) for k in GPU_KINDS)

    @property
    def start(self) -> float:
        return min(self.ts) if len(self.ts) else 0.0

    @property
    def end(self) -> float:
        return max(map(add, self.ts, self.dur)) if len(self.ts) else 0.0
