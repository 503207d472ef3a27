"""Host reads of tensors in the user's code, counted per step and per line (PD008 evidence).

`Tensor.item`, `.cpu()`, `.numpy()`, `.tolist()`, `float(t)` / `int(t)` / `bool(t)` (an `if t:`)
and printing or formatting a tensor all need the value on the host: on a CUDA tensor each one
waits until the GPU has run everything queued before it. On a CPU run they cost nothing, but in a
script that targets CUDA they are the syncs its GPU runs will pay, so they are counted there too.

Counted where the user's own code makes the call (the calling frame is user code), and where a
library reads a tensor that the user's call handed it (`writer.add_scalar("loss", loss, step)`:
TensorBoard's `make_np` reads it; `pbar.set_postfix(loss=loss)`, `logger.info("%s", loss)`): the read
counts at the user's line that called into the library, since passing the tensor instead of a value
read less often is the user's choice (`_through`: the tensor read, or one sharing its storage, is an
argument of the library function the user's frame called, or inside a list, tuple or dict argument).
torch's internals (an optimizer reading its step count, `clip_grad_norm_`) and a library's reads of
its own tensors (Lightning's loop logging the losses it kept) are not the user's line to change. Reads inside the DataLoader's fetch (a dataset drawing random numbers in
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
_MAX_CALLERS = 30  # frames walked for the training loop's line that called a reading helper
_LIBRARY = object()  # `HostReadProbe.lines`: a library's line, whose reads `_through` attributes per call


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
        # (code, line, kind) -> line, None: not counted, _LIBRARY: a library's line (`_through` decides per call)
        self.lines: dict[tuple[Any, int, str], _Line | None | object] = {}
        self.order: list[_Line] = []

    def install(self) -> None:
        torch = self.torch
        compiling = tracing(torch)
        probe, main, get_ident, frame_of, clock = self, self.main_ident, threading.get_ident, sys._getframe, self.clock

        def wrap(orig: Any, kind: str) -> Any:
            def read(t: Any, *args: Any, **kwargs: Any) -> Any:
                # dynamo inlines this wrapper when it traces a compiled region: is_compiling() is a
                # constant True there, and the region sees torch's own method
                if compiling() or probe.busy or get_ident() != main or clock.in_batch:  # not in a batch's fetch
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
            if line is _LIBRARY:
                line = self._through(kind, t, frame)
            if isinstance(line, _Line):
                line.cur += 1
        except Exception as e:  # noqa: BLE001 - never into the user's script
            self.err("host_reads", e)

    def _first(self, key: tuple[Any, int, str], frame: Any, t: Any) -> _Line | None | object:
        """The first read from this line: is it the user's own call, outside the DataLoader's fetch?
        A library's line is `_LIBRARY`: whether a read there is the user's is decided per call."""
        t0 = self.clock.pc()
        line: _Line | None | object = None
        if not is_user_file(frame.f_code.co_filename):
            line = _LIBRARY
        elif not sites.in_loader(frame):
            site = sites.site_of(frame)
            if site is not None:
                dev = getattr(getattr(t, "device", None), "type", None) or "cpu"
                line = _Line(site, key[2], len(self.clock.steps), dev, _callers(frame))
                self.order.append(line)
        self.lines[key] = line
        self.clock.exclude(t0)
        return line

    def _through(self, kind: str, t: Any, frame: Any) -> _Line | None | object:
        """A library's read (`frame` is the library's): the user's line that called into the library,
        where the library function it called was handed `t` (or a tensor sharing its storage: TensorBoard
        reads `scalar.detach().cpu()`), as an argument or inside a list, tuple or dict argument; None
        otherwise (torch's own step counts, a library's own tensors)."""
        t0 = self.clock.pc()
        try:
            entry, f, depth = frame, frame.f_back, 0
            while f is not None and depth < _MAX_CALLERS and not is_user_file(f.f_code.co_filename):
                entry, f, depth = f, f.f_back, depth + 1
            if f is None or depth >= _MAX_CALLERS or not _handed(self.torch, t, entry):
                return None
            key = (f.f_code, f.f_lineno, kind)
            line = self.lines[key] if key in self.lines else self._first(key, f, t)
            return line if isinstance(line, _Line) else None
        finally:
            self.clock.exclude(t0)

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


def _handed(torch: Any, t: Any, entry: Any) -> bool:
    """Whether `t`'s storage is that of a tensor among the arguments of the library function `entry`
    runs (its locals: the arguments first), a few levels into lists, tuples and dicts."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - a tensor subclass without a storage
        return False
    if not ptr:
        return False
    T = torch.Tensor
    todo = [(v, 0) for v in list(entry.f_locals.values())[:32]]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, T):
            try:
                if v.untyped_storage().data_ptr() == ptr:
                    return True
            except Exception:  # noqa: BLE001
                continue
        elif depth < 2 and isinstance(v, (list, tuple)):
            todo.extend((x, depth + 1) for x in v[:16])
        elif depth < 2 and isinstance(v, dict):
            todo.extend((x, depth + 1) for x in list(v.values())[:16])
    return False
