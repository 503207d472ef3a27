"""The top-level modules' forward calls: where the script calls its model, whether autocast was
on, the parameters' dtype and device; and each step's forward time for the step clock.

One wrapper around `torch.nn.Module.__call__` (the class's, so nothing is left on the user's
modules: `torch.save(model)`, `copy.deepcopy(model)` and pickling see exactly what a bare run
has) sees each module call made outside another one on the main thread: a top-level call. No
module hook is registered, global or per module: under `torch.compile` dynamo inlines module
hooks and would break its graphs at them, and global hooks make it compile `__call__` with its
hooks. Dynamo may still inline this wrapper (a compiled frame calling a submodule, or
`torch.compile(module)` wrapping the bound `__call__`): its first test, `tracing()` (`patches.tracing`), is a
constant to dynamo, and from there the wrapper only calls through, so the traced graph is the one
a bare run gets. The probe's bookkeeping is keyed by `id()` and checked through a weak reference,
never stored on the module.

Each module call on the main thread, top-level or not, first lets the profiled window look at its
time budget (`poll`), so that the window ends inside a long step, even inside one long forward
(LBFGS's closure over a 999-step LSTMCell loop is one top-level call); perfdoctor's own work inside
a forward (the window's stop, a probe's site lookup: `StepClock.exclude`) is not forward time.
Top-level modules are discovered during the first steps (`stop_discovery`); later top-level
calls of those modules are still counted and timed, other modules' calls just pass through.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import msgspec

from perfdoctor.capture import sites
from perfdoctor.capture.clock import StepClock
from perfdoctor.capture.patches import ErrorLog, Patches, tracing
from perfdoctor.capture.probes.modules import ModuleProbe, Watch
from perfdoctor.contracts.run import EvalGradRecord, ForwardRecord
from perfdoctor.usercode import is_user_file


class ForwardProbe:
    def __init__(self, torch: Any, clock: StepClock, err: ErrorLog, modules: ModuleProbe | None = None):
        self.torch = torch
        self.modules = modules  # the module trees: read at a followed module's first call, one forward watched
        self.clock = clock
        self.err = err
        self.main_ident = threading.get_ident()
        self.patches = Patches()
        self.busy = False  # inside a top-level module call
        self.discover = True  # a top-level call of a module not seen yet makes a new record
        # id() -> (weak reference to the module, its record); the reference tells a reused id apart
        self.known: dict[int, tuple[weakref.ref, ForwardRecord]] = {}
        self.forward: list[ForwardRecord] = []
        # (id() of the module, the calling line's code object, its line) -> the eval-mode forwards there
        self.eval_grad: dict[tuple[int, Any, int], EvalGrad] = {}
        # (code object, line) of the user's frames on the stacks of training-mode forwards with grad on
        self.train_lines: set[tuple[Any, int]] = set()
        self.trained: set[int] = set()  # id() of the modules called in training mode with grad on
        self.poll: Callable[[], None] = lambda: None  # set by the coordinator: the window's time budget
        # only the step clock's count of top-level forwards (the recorder's timing capture): no time, no
        # layout, no PD019 measurement, no watch of a forward's submodules
        self.count_only = False
        self.unwatched: dict[int, ForwardRecord] = {}  # id() of a followed module whose forward was not watched yet
        self.watching: Watch | None = None  # the watch of the forward running now, if any

    def install(self) -> None:
        probe, clock = self, self.clock
        Module = self.torch.nn.Module
        orig = Module.__call__
        compiling, get_ident, main, pc = tracing(self.torch), threading.get_ident, self.main_ident, clock.pc
        grad_enabled, saved_tensors_hooks = self.torch.is_grad_enabled, self.torch.autograd.graph.saved_tensors_hooks

        # the first argument must be named `self`: torch.profiler's Python tracer takes the code of
        # `Module.__call__` for the module-call frame and reads the module from its local `self`
        # (it crashes the interpreter when there is none)
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            # compiling() (`patches.tracing`) first: to dynamo it is True, and nothing below is traced;
            # nothing is measured of a forward that jit.trace, torch.fx or torch.export runs
            if compiling() or get_ident() != main or clock.bwd_depth or clock.in_batch:
                # (activation checkpointing re-runs forward inside backward: not a forward call; a
                # torchvision transform run by a DataLoader's fetch is data loading)
                return orig(self, *args, **kwargs)
            if probe.count_only:  # perfdoctor verify's timing capture: the step clock's count, nothing measured
                if probe.busy or not probe._enter(self):
                    return orig(self, *args, **kwargs)
                probe.busy = True
                try:
                    return orig(self, *args, **kwargs)
                finally:
                    probe.busy = False
                    clock.forwards += 1
            probe.poll()
            if probe.busy:  # a submodule's call inside a followed forward
                w = probe.watching
                return orig(self, *args, **kwargs) if w is None else w.call(orig, self, args, kwargs)
            followed = probe._enter(self)
            # an eval-mode forward that records autograd (PD019); a training one marks its lines
            eg = None
            if self.training:
                if grad_enabled():
                    probe._trains(self)
            elif grad_enabled():
                eg = probe._eval_grad(self)
            if not followed and eg is None:
                return orig(self, *args, **kwargs)
            probe.busy = True
            probe.watching = probe._watch(self) if followed and probe.unwatched else None
            saved = eg.measure() if eg is not None else None
            t0, own0 = pc(), clock.own
            try:
                if saved is None:
                    return orig(self, *args, **kwargs)
                with saved_tensors_hooks(saved.pack, saved.unpack):
                    return orig(self, *args, **kwargs)
            finally:
                dt = pc() - t0 - max(0.0, clock.own - own0)  # less perfdoctor's own work inside it
                probe.busy = False
                if probe.watching is not None:
                    probe.watching.finish()
                    probe.watching = None
                if followed:
                    clock.fwd += dt
                    clock.forwards += 1
                if eg is not None:
                    eg.done(dt, saved, len(clock.steps) + 1 if clock.kind is not None else 0,
                            _batch(probe.torch.Tensor, args) if saved is not None else 0)

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
                          params=int(sum(q.numel() for q in mod.parameters())),
                          lookup_params=self._lookup_params(mod), classes=_user_classes(mod))
        self.known[id(mod)] = (weakref.ref(mod), r)
        if self.modules is not None:
            self.unwatched[id(mod)] = r
        self.forward.append(r)
        return r

    def _lookup_params(self, mod: Any) -> int:
        """The parameters of the embedding tables in `mod`'s tree: a lookup reads rows, no matmul."""
        nn = self.torch.nn
        tables = (nn.Embedding, nn.EmbeddingBag)
        return int(sum(p.numel() for m in mod.modules() if isinstance(m, tables) for p in m.parameters(recurse=False)))

    def _autocast(self, dev: str | None) -> bool:
        torch = self.torch
        try:
            return bool(torch.is_autocast_enabled(dev)) or (dev != "cuda" and bool(torch.is_autocast_enabled()))
        except TypeError:  # older torch: no device argument
            return bool(torch.is_autocast_enabled() or (dev == "cpu" and torch.is_autocast_cpu_enabled()))

    def _eval_grad(self, mod: Any) -> EvalGrad | None:
        """The bookkeeping of an eval-mode forward with grad mode on, at the line calling it, with
        the user's frames it was called through (read once per line)."""
        try:
            f = sys._getframe(2)  # the caller of Module.__call__
            key = (id(mod), f.f_code, f.f_lineno)
            e = self.eval_grad.get(key)
            if e is None or e.ref() is not mod:
                e = self.eval_grad[key] = EvalGrad(mod, sites.caller_site(2), self.torch._C._autograd,
                                                   _user_stack(f))
            return e
        except Exception as e:  # noqa: BLE001
            self.err("forward", e)
            return None

    def _trains(self, mod: Any) -> None:
        """Note the module, and the user's lines a training-mode forward with grad on was called
        through, from its caller outwards, up to the first line already noted (the same path again
        costs one lookup)."""
        try:
            self.trained.add(id(mod))
            f: Any = sys._getframe(2)
            seen = self.train_lines
            while f is not None:
                if is_user_file(f.f_code.co_filename):
                    key = (f.f_code, f.f_lineno)
                    if key in seen:
                        return
                    seen.add(key)
                f = f.f_back
        except Exception as e:  # noqa: BLE001
            self.err("forward", e)

    def _watch(self, mod: Any) -> Watch | None:
        """A watch of this forward's submodule calls where `mod`'s were never watched (its tree is
        read then: at its first call that torch does not trace)."""
        r = self.unwatched.get(id(mod))
        if r is None or self.modules is None:
            return None
        w = self.modules.watch(mod, r)
        if w is not None:
            del self.unwatched[id(mod)]
        return w

    def stop_discovery(self) -> None:
        """The first steps are over: the top-level modules are known, other calls pass through."""
        self.discover = False
        if self.modules is not None:
            self.modules.refresh()

    def records(self) -> list[ForwardRecord]:
        return [msgspec.structs.replace(r, autocast=r.autocast_calls * 2 >= r.calls > 0) for r in self.forward]

    def eval_grad_records(self) -> list[EvalGradRecord]:
        """One record per evaluation line: the modules called through it (a model's forward, then
        the Linear layers a `compute_scores` method calls, each a top-level call) merged."""
        by_site: dict[Any, list[EvalGradRecord]] = {}
        for e in self.eval_grad.values():
            mod = e.ref()
            r = e.record(self.train_lines, mod is not None and id(mod) in self.trained)
            by_site.setdefault((r.site.file, r.site.line) if r.site is not None else id(r), []).append(r)
        return [_merged(rs) for rs in by_site.values()]


def _user_classes(mod: Any) -> list[str]:
    """The classes of `mod`'s module tree and their bases that the user's files define, as
    "<real path of the file>:<qualname>" (read from the classes; nothing on the modules is touched)."""
    out: set[str] = set()
    for cls in {c for m in mod.modules() for c in type(m).__mro__}:
        f = getattr(sys.modules.get(cls.__module__), "__file__", None)
        if f and is_user_file(f):
            out.add(f"{os.path.realpath(f)}:{cls.__qualname__}")
    return sorted(out)


def _merged(rs: list[EvalGradRecord]) -> EvalGradRecord:
    """The eval-mode forwards of several modules at one line as one: per measured call the bytes all
    of them saved, per step their time; the module, calls and batch of the one that saved the most."""
    if len(rs) == 1:
        return rs[0]
    main = max(rs, key=lambda r: (sum(r.saved_bytes), r.calls))
    measured = [r.saved_bytes for r in rs if r.saved_bytes]
    n = min((len(b) for b in measured), default=0)
    steps: dict[int, list[float]] = {}
    for r in rs:
        for row in r.ms_by_step:
            cur = steps.setdefault(int(row[0]), [0.0, 0])
            cur[0] += row[1]
            cur[1] = max(cur[1], row[2] if len(row) > 2 else 1)
    return msgspec.structs.replace(
        main, calls=max(r.calls for r in rs), backward=max(r.backward for r in rs), trained=any(r.trained for r in rs),
        saved_bytes=[sum(b[i] for b in measured) for i in range(n)], batch=main.batch[:n],
        ms_by_step=[[i, round(ms, 4), c] for i, (ms, c) in sorted(steps.items())])


def _user_stack(frame: Any, limit: int = 64) -> list[tuple[Any, int, Any]]:
    """(code object, line, site) of each user frame from `frame` outwards."""
    out: list[tuple[Any, int, Any]] = []
    while frame is not None and len(out) < limit:
        if is_user_file(frame.f_code.co_filename):
            out.append((frame.f_code, frame.f_lineno, sites.site_of(frame)))
        frame = frame.f_back
    return out


def _batch(tensor: Any, args: tuple) -> int:
    """The first dimension of a forward's first tensor argument (its batch), 0 where it has none: the
    shape is read, nothing else."""
    try:
        for a in args:
            if isinstance(a, tensor):
                return int(a.shape[0]) if a.dim() else 0
    except Exception:  # noqa: BLE001  (a tensor subclass without a shape: none)
        pass
    return 0


class SavedTensors:
    """One forward's tensors saved for backward, counted as autograd packs them (pack returns the
    tensor with this counter, unpack hands the tensor back and notes that a backward used it): the
    graph keeps what it always keeps, nothing more. Parameters (leaves that require grad) and
    storages seen before in the same forward are not counted."""

    __slots__ = ("bytes", "storages", "used")

    def __init__(self) -> None:
        self.bytes = 0
        self.storages: set[int] = set()
        self.used = False

    def pack(self, t: Any) -> Any:
        try:
            if not (t.is_leaf and t.requires_grad):
                st = t.untyped_storage()
                ptr = st.data_ptr()
                if ptr not in self.storages:
                    self.storages.add(ptr)
                    self.bytes += st.nbytes()
        except Exception:  # noqa: BLE001  (a tensor subclass without a plain storage: not counted)
            pass
        return (self, t)

    @staticmethod
    def unpack(packed: Any) -> Any:
        packed[0].used = True
        return packed[1]


class EvalGrad:
    """The eval-mode forwards with grad mode on at one line (PD019): calls and time per step; on the
    first MEASURED calls, the bytes autograd saved and whether a backward used them. Saved-tensor
    hooks are only put around a forward while dynamo has compiled nothing in this process and the
    module holds no compiled module (no compiled code runs under them), and where the script has
    none of its own in force (activation offloading, checkpointing: the innermost hooks are the
    ones autograd uses) nor has disabled them."""

    MEASURED = 20

    def __init__(self, mod: Any, site: Any, autograd: Any, stack: list[tuple[Any, int, Any]] | None = None):
        self.autograd = autograd  # torch._C._autograd
        self.ref = weakref.ref(mod)
        self.site = site
        self.stack = stack or []  # the user's frames of the first call, innermost first
        self.module = type(mod).__name__
        self.calls = 0
        self.by_step: dict[int, list[float]] = {}  # step -> [ms, calls]
        self.saved: list[SavedTensors] = []
        self.batch: list[int] = []  # per measured call, its input's first dimension

    def measure(self) -> SavedTensors | None:
        if len(self.saved) >= self.MEASURED:
            return None
        utils = sys.modules.get("torch._dynamo.utils")
        ag, mod = self.autograd, self.ref()
        try:
            if utils is not None and (utils.counters.get("frames", {}).get("total") or utils.get_compilation_metrics()):
                return None
            if mod is None or any(type(m).__name__ == "OptimizedModule" or getattr(m, "_compiled_call_impl", None)
                                  is not None for m in mod.modules()):
                return None
            if not ag._saved_tensors_hooks_is_enabled() or ag._top_saved_tensors_default_hooks(False) is not None:
                return None
        except (AttributeError, RuntimeError, KeyError, TypeError):  # another torch: no way to tell, no hooks
            return None
        return SavedTensors()

    def done(self, dt: float, saved: SavedTensors | None, step: int, batch: int) -> None:
        self.calls += 1
        cur = self.by_step.setdefault(step, [0.0, 0])
        cur[0] += dt * 1e3
        cur[1] += 1
        if saved is not None:
            self.saved.append(saved)
            self.batch.append(batch)

    def where(self, train_lines: set[tuple[Any, int]]) -> Any:
        """The evaluation's own line: from the calling line outwards, the first user line that no
        training forward ran through. A helper that both the training step and the evaluation call
        (`hidden = model(x)` in a `forward(model, batch)` both loops use, an encoder's layer call) is
        not where torch.no_grad() can go; the evaluation loop's line calling it is. The calling line
        where no training forward was seen (or every line is shared)."""
        for code, line, site in self.stack:
            if (code, line) not in train_lines:
                return site
        return self.site

    def record(self, train_lines: set[tuple[Any, int]] | None = None, trained: bool = False) -> EvalGradRecord:
        site = self.where(train_lines) if train_lines else self.site
        return EvalGradRecord(site=site, module=self.module, calls=self.calls, trained=trained,
                              ms_by_step=[[i, round(ms, 4), n] for i, (ms, n) in sorted(self.by_step.items()) if i],
                              saved_bytes=[s.bytes for s in self.saved], backward=sum(s.used for s in self.saved),
                              batch=list(self.batch))
