"""Host reads of tensors in the user's code, counted per step and per line (PD008 evidence).

`Tensor.item`, `.cpu()`, `.numpy()`, `.tolist()`, `float(t)` / `int(t)` / `bool(t)` (an `if t:`)
and printing or formatting a tensor all need the value on the host: on a CUDA tensor each one
waits until the GPU has run everything queued before it. On a CPU run they cost nothing, but in a
script that targets CUDA they are the syncs its GPU runs will pay, so they are counted there too.

Counted only where the user's own code makes the call (the calling frame is user code): torch's
internals (an optimizer reading its step count, `clip_grad_norm_`) and libraries are not the
user's line to change. Reads inside the DataLoader's fetch (a dataset drawing random numbers in
`__getitem__`) are CPU work on CPU tensors and are not counted. On a CUDA run, reads of CPU
tensors are not counted either.

Cheap: the Tensor methods are wrapped while the probe is installed; a call first checks that
torch is not tracing (`patches.tracing`: inside a compiled region, jit.trace, torch.fx or
torch.export the probe does nothing, so the graph sees torch's own methods), then looks its calling line up in a dict. Only
the first call from a line walks the stack and reads the source (that time is taken out of the
step, `StepClock.exclude`); after that a call costs a dict lookup and an increment. Nothing is
stored on tensors or other user objects.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from perfdoctor.capture import sites
from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.patches import ErrorLog, Patches, tracing
from perfdoctor.contracts.run import HostReadRecord, Site
from perfdoctor.usercode import is_user_file

# Tensor method -> the kind of read it is
METHODS = {"item": "item", "cpu": "cpu", "numpy": "numpy", "tolist": "tolist", "__float__": "float",
           "__int__": "int", "__bool__": "bool", "__repr__": "print", "__format__": "print"}
_LOADER_FILES = ("torch/utils/data/", "torch\\utils\\data\\")
_MAX_DEPTH = 60  # frames walked to see whether a line runs inside the DataLoader's fetch
_MAX_CALLERS = 30  # frames walked for the training loop's line that called a reading helper


class _Line:
    """One (line, kind) of the user's code that reads tensors on the host."""

    __slots__ = ("site", "kind", "counts", "cur", "device", "callers")

    def __init__(self, site: Site, kind: str, steps_so_far: int, device: str, callers: list[tuple[Any, Site]]):
        self.site, self.kind, self.device, self.callers = site, kind, device, callers
        self.counts: list[int] = [0] * steps_so_far  # reads per step, step i at index i - 1
        self.cur = 0

    def record(self, step_codes: tuple[Any, ...] | None) -> HostReadRecord:
        """The read's counts, and the innermost function it shares with the first optimizer step's stack
        (the training loop's) named at the line that led into the reading helper."""
        caller = next((site for code, site in self.callers if any(code is c for c in step_codes)), None) \
            if step_codes else None
        return HostReadRecord(site=self.site, kind=self.kind, device=self.device,
                              counts_per_step=list(self.counts), caller=caller)


class HostReadProbe:
    def __init__(self, torch: Any, clock: StepClock, err: ErrorLog):
        self.torch = torch
        self.clock = clock
        self.err = err
        self.patches = Patches()
        self.main_ident = threading.get_ident()
        self.cuda_run = False  # set at the first step: on a CUDA run only device tensors count
        self.busy = False  # inside a wrapped call (print reads .item() itself): count the outer one only
        self.lines: dict[tuple[Any, int, str], _Line | None] = {}  # (code, line, kind) -> line, None: not counted
        self.order: list[_Line] = []

    def install(self) -> None:
        torch = self.torch
        compiling = tracing(torch)
        probe, main, get_ident, frame_of = self, self.main_ident, threading.get_ident, sys._getframe

        def wrap(orig: Any, kind: str) -> Any:
            def read(t: Any, *args: Any, **kwargs: Any) -> Any:
                # dynamo inlines this wrapper when it traces a compiled region: is_compiling() is a
                # constant True there, and the region sees torch's own method
                if compiling() or probe.busy or get_ident() != main:
                    return orig(t, *args, **kwargs)
                probe.busy = True
                try:
                    probe.hit(kind, t, frame_of(1))
                    return orig(t, *args, **kwargs)
                finally:
                    probe.busy = False

            read.__wrapped__ = orig  # type: ignore[attr-defined]
            read.__name__ = getattr(orig, "__name__", kind)
            return read

        for name, kind in METHODS.items():
            self.patches.replace(torch.Tensor, name, wrap(getattr(torch.Tensor, name), kind))

    def uninstall(self) -> None:
        self.patches.undo()

    def hit(self, kind: str, t: Any, frame: Any) -> None:
        try:
            if self.cuda_run and t.is_cpu:
                return
            key = (frame.f_code, frame.f_lineno, kind)
            line = self.lines[key] if key in self.lines else self._first(key, frame, t)
            if line is not None:
                line.cur += 1
        except Exception as e:  # noqa: BLE001 - never into the user's script
            self.err("host_reads", e)

    def _first(self, key: tuple[Any, int, str], frame: Any, t: Any) -> _Line | None:
        """The first read from this line: is it the user's own call, outside the DataLoader's fetch?"""
        t0 = self.clock.pc()
        line: _Line | None = None
        if is_user_file(frame.f_code.co_filename) and not _in_loader(frame):
            site = sites.site_of(frame)
            if site is not None:
                dev = getattr(getattr(t, "device", None), "type", None) or "cpu"
                line = _Line(site, key[2], len(self.clock.steps), dev, _callers(frame))
                self.order.append(line)
        self.lines[key] = line
        self.clock.exclude(t0)
        return line

    # -- driven by the step clock ---------------------------------------------------------------
    def end_step(self) -> None:
        for line in self.order:
            line.counts.append(line.cur)
            line.cur = 0

    def merge_steps(self) -> None:
        """A stronger clock took over: the reads so far belong to its first step."""
        for line in self.order:
            line.cur += sum(line.counts)
            line.counts = []

    def whole_run(self) -> None:
        """No step clock: the run is one step."""
        for line in self.order:
            line.counts = [sum(line.counts) + line.cur]

    def records(self) -> list[HostReadRecord]:
        return [line.record(self.clock.step_codes) for line in self.order if any(line.counts)]


def _callers(frame: Any) -> list[tuple[Any, Site]]:
    """The user's frames that called the reading one, innermost first, each with its current line:
    read once per line, at its first read, so that the one in the training loop's function can be
    named when the run has seen that function (`StepClock.step_codes`, set at the first optimizer step)."""
    out: list[tuple[Any, Site]] = []
    f, depth = frame.f_back, 0
    while f is not None and depth < _MAX_CALLERS:
        if f.f_code is not frame.f_code and is_user_file(f.f_code.co_filename):
            site = sites.site_of(f)
            if site is not None:
                out.append((f.f_code, site))
        f, depth = f.f_back, depth + 1
    return out


def _in_loader(frame: Any) -> bool:
    """Whether `frame` runs inside the DataLoader (a dataset's __getitem__, a collate_fn)."""
    f, depth = frame, 0
    while f is not None and depth < _MAX_DEPTH:
        name = f.f_code.co_filename
        if any(p in name for p in _LOADER_FILES):
            return True
        f, depth = f.f_back, depth + 1
    return False
