"""A fake CUDA layer, so that perfdoctor's CUDA paths run on every CI machine (which has no GPU).

`FakeCuda` replaces exactly the `torch.cuda` functions perfdoctor calls or wraps (`STUBS`; a test,
tests/capture/test_fake_cuda.py, reads perfdoctor's source for every `torch.cuda.X` it uses and checks that
the two lists are the same), and fails the test on the calls perfdoctor must never make
(`FORBIDDEN`: `synchronize` would serialise the user's GPU work). It models what those calls
answer on a real machine closely enough to tell right from wrong readings:

- CUDA is not initialised until a tensor first goes to a CUDA device (or `init()`), as torch's
  lazy initialisation; before that the allocator's statistics are empty.
- Tensors moved with `Tensor.to` / `Tensor.cuda` / `torch.as_tensor(..., device=)` to
  `cuda[:N]` become `FakeCudaTensor`s: the same CPU storage, reporting `is_cuda` and their
  `device`; ops on them give plain CPU tensors, so a model trains as usual. A device's allocated
  bytes are the bytes of its live fake tensors plus what a test `alloc()`s; its peak is the most
  allocated since the last `reset_peak_memory_stats`, as the caching allocator keeps it.
- The current device stays 0 (nothing here calls `set_device`): a rank that moves its tensors to
  `cuda:1` allocates on device 1 while `current_device()` answers 0, as on a real machine.
- A device gets a context when it first allocates; `mem_get_info(d)` creates one on `d`, as
  `cudaMemGetInfo` does. `contexts` says which devices have one, `calls` every call made.

Use the `fake_cuda` fixture (tests/conftest.py): `def test_x(fake_cuda): ...`; everything is put
back after the test.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

# the torch.cuda functions perfdoctor calls or wraps (checked against its source by a test)
STUBS = ("is_available", "is_initialized", "device_count", "current_device", "memory_stats",
         "reset_peak_memory_stats", "max_memory_allocated", "max_memory_reserved", "mem_get_info",
         "get_device_properties", "empty_cache")
FORBIDDEN = ("synchronize",)  # a call fails the test
GIB = 1 << 30


class FakeCudaTensor(torch.Tensor):
    """A CPU tensor that says it lives on a CUDA device; ops on it return plain tensors."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    _pd_index = 0

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", self._pd_index)


@dataclass
class Props:
    name: str = "NVIDIA H100 80GB HBM3 (fake)"
    major: int = 9
    minor: int = 0
    total_memory: int = 80 * GIB
    multi_processor_count: int = 132


@dataclass
class FakeCuda:
    count: int = 1
    props: Props = field(default_factory=Props)
    initialized: bool = False
    allocated: dict[int, int] = field(default_factory=dict)
    peak: dict[int, int] = field(default_factory=dict)
    contexts: set[int] = field(default_factory=set)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    empty_cache_calls: int = 0

    # -- what a test drives -----------------------------------------------------------------------
    def init(self) -> None:
        self.initialized = True

    def alloc(self, device: int, nbytes: int) -> None:
        """Allocate (or, negative, free) bytes on a device, as the model's tensors would."""
        self.init()
        self.contexts.add(device)
        a = self.allocated[device] = self.allocated.get(device, 0) + nbytes
        self.peak[device] = max(self.peak.get(device, 0), a)

    def names(self) -> list[str]:
        return [c for c, _ in self.calls]

    # -- torch.cuda ---------------------------------------------------------------------------------
    def _index(self, device: Any) -> int:
        if device is None:
            return 0
        if isinstance(device, str):
            return int(device.split(":", 1)[1]) if ":" in device else 0
        if isinstance(device, torch.device):
            return device.index or 0
        return int(device)

    def is_available(self) -> bool:
        self.calls.append(("is_available", None))
        return True

    def is_initialized(self) -> bool:
        self.calls.append(("is_initialized", None))
        return self.initialized

    def device_count(self) -> int:
        self.calls.append(("device_count", None))
        return self.count

    def current_device(self) -> int:
        self.calls.append(("current_device", None))
        self.init()
        return 0

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        d = self._index(device)
        self.calls.append(("memory_stats", d))
        if not self.initialized:
            return {}
        return {"allocated_bytes.all.current": self.allocated.get(d, 0),
                "allocated_bytes.all.peak": self.peak.get(d, 0),
                "reserved_bytes.all.peak": self.peak.get(d, 0)}

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        d = self._index(device)
        self.calls.append(("reset_peak_memory_stats", d))
        self.peak[d] = self.allocated.get(d, 0)

    def max_memory_allocated(self, device: Any = None) -> int:
        d = self._index(device)
        self.calls.append(("max_memory_allocated", d))
        return self.peak.get(d, 0) if self.initialized else 0

    def max_memory_reserved(self, device: Any = None) -> int:
        d = self._index(device)
        self.calls.append(("max_memory_reserved", d))
        return self.peak.get(d, 0) if self.initialized else 0

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        d = self._index(device)
        self.calls.append(("mem_get_info", d))
        self.init()
        self.contexts.add(d)  # cudaMemGetInfo needs a context on the device
        total = self.props.total_memory
        return total - self.allocated.get(d, 0) - GIB // 2, total

    def get_device_properties(self, device: Any = None) -> Props:
        d = self._index(device)
        self.calls.append(("get_device_properties", d))
        assert 0 <= d < self.count, "Invalid device id"
        self.init()
        return self.props

    def empty_cache(self) -> None:
        self.calls.append(("empty_cache", None))
        self.empty_cache_calls += 1

    def forbidden(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            raise AssertionError(f"perfdoctor called torch.cuda.{name}(), which it must never do")
        return call

    # -- tensors ------------------------------------------------------------------------------------
    def to_device(self, t: torch.Tensor, index: int) -> torch.Tensor:
        """A fake CUDA tensor for `t` on device `index`, counted in that device's memory."""
        assert 0 <= index < self.count, f"CUDA error: invalid device ordinal {index}"
        out = t.as_subclass(FakeCudaTensor)
        out._pd_index = index
        n = t.nelement() * t.element_size()
        self.alloc(index, n)
        weakref.finalize(out, self.alloc, index, -n)
        return out

    def cuda_index(self, device: Any) -> int | None:
        """The CUDA device index a `device=` argument names, None if it is not a CUDA device."""
        if isinstance(device, FakeCudaTensor):
            return device._pd_index
        if isinstance(device, str) and device.split(":", 1)[0] == "cuda":
            return self._index(device)
        if isinstance(device, torch.device) and device.type == "cuda":
            return device.index or 0
        return None


def install(monkeypatch: Any, fake: FakeCuda) -> FakeCuda:
    """Put `fake` in place of torch.cuda's functions (and torch.cuda.memory's, where they live too),
    and make Tensor.to / Tensor.cuda / torch.as_tensor understand CUDA devices (`Tensor.copy_`
    into a fake CUDA tensor needs nothing: its storage is on the CPU)."""
    owners = [torch.cuda, torch.cuda.memory]
    for name in STUBS:
        for o in owners:
            if hasattr(o, name):
                monkeypatch.setattr(o, name, getattr(fake, name))
    for name in FORBIDDEN:
        monkeypatch.setattr(torch.cuda, name, fake.forbidden(name))
    T = torch.Tensor
    orig_to, orig_as_tensor = T.to, torch.as_tensor

    def to(t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        args_l = list(args)
        d = fake.cuda_index(kwargs.get("device"))
        if d is not None:
            kwargs.pop("device")
        elif args_l and fake.cuda_index(args_l[0]) is not None:
            d = fake.cuda_index(args_l.pop(0))
        if d is None:
            return orig_to(t, *args, **kwargs)
        kwargs.pop("non_blocking", None)
        args_l = [a for a in args_l if not isinstance(a, bool)]
        out = orig_to(t.as_subclass(torch.Tensor), *args_l, **kwargs) if (args_l or kwargs) else t
        return t if isinstance(t, FakeCudaTensor) and t._pd_index == d else fake.to_device(out, d)

    def cuda(t: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> torch.Tensor:
        return fake.to_device(t, fake._index(device))

    def as_tensor(data: Any, dtype: Any = None, device: Any = None) -> torch.Tensor:
        d = fake.cuda_index(device)
        out = orig_as_tensor(data, dtype=dtype)
        return out if d is None else fake.to_device(out.clone() if out is data else out, d)

    monkeypatch.setattr(T, "to", to)
    monkeypatch.setattr(T, "cuda", cuda)
    monkeypatch.setattr(torch, "as_tensor", as_tensor)
    return fake
