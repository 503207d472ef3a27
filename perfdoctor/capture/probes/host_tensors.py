"""Tensors a factory makes on the host inside the training step and the step then moves to a device
(PD004): the factory's line and the move's line, whatever function each is in (a helper that
returns `torch.randint(...)`, its caller's `.to(device)`; `torch.arange(L).expand_as(w).to(device)`
in an attention call; `torch.randn(...).type_as(imgs)`; an index made on the host into the model's
computation, `idx = torch.triu_indices(t, t)` then `scores[..., idx[0], idx[1]] = -inf`: indexing a
GPU tensor with a host index copies the index on every call; so do numpy index arrays, SASRec's
`pos_logits[np.where(pos != 0)]`: a pair of their own, factory "numpy", at the indexing line).

A CPU run moves nothing (the device is the CPU), but the script's `.to(device)` / `.cuda()` /
`.type_as(batch)` on the tensor is the copy its GPU runs pay on every step. Watched from the end of
the first step for `WATCH_STEPS` steps, on the main thread of this process (never in a forked
DataLoader worker): torch's factories (`FACTORIES`, module functions of torch) note the tensors they
return when the caller is the user's code, by `id()` with a weak reference, forgotten at each step
end; `Tensor.to`, `.cuda` and `.type_as` look the tensor (or the tensor a view was taken of) up in
that dict and count the pair of lines; `Tensor.__getitem__` / `__setitem__` do the same for a
noted tensor given as an index into a tensor that needs a gradient or has a `grad_fn` (what runs on
the GPU where the script trains there; a host tensor indexed by a host index copies nothing; a 0-dim
index, `hidden[i]` for `i` in `torch.arange(n)`, is read as a Python int and copies nothing either). Every
user line where a factory made a host tensor in the watched steps, moved or not, is noted too
(`watch_record`): a factory line of the user's that is not among them did not run in those steps (the
static read's PD004 candidate there stands down). A dtype cast on the host (`.float()`, `.long()`,
`.to(torch.float32)`: `CASTS`) returns a new tensor that is still the same data: it inherits what
made its input, so `batch_x.float().to(device)` is the loader's batch moved; host arithmetic with a
factory's tensor (`img + torch.randn(img.size()) * 0.2`: `ARITHMETIC`) returns one that carries that
factory's, so the sum's move is the factory's; so do the ops that build a mask out of it (comparisons,
`~`, `&`, `masked_fill`, `torch.triu` / `tril`: `MASKING`; a causal mask made from `torch.ones` every
step and moved). A copy in another layout (`.contiguous()`, `.clone()`, `.reshape()`: `COPIES`) is the
same data, followed as a cast is (a loader's batch transposed and made contiguous, then moved). A factory's tensor the host then fills with values it
computed (`t[idx] = v`: a host array or tensor no factory of the step made, or more than one distinct
number: ymfa's generator, `src = torch.zeros(L, B)` then `src[j, i] = vocab[word]` per token) is a
buffer carrying the host's data, as `torch.tensor(data)` is: its move is that data crossing, noted as a
batch's (the data path: PD003), not a factory's output to make on the device; writes of one constant
(`mask[:, :k] = 1`) leave it a factory's. The user functions that write such data are noted by the
profiler's names of their frames (`HostFactoryWatch.filled`): the GPU-step estimate leaves their ops
to the host. A move of a tensor no factory of the step made, at the user's line inside the DataLoader's
fetch, is a Dataset moving each sample as it reads it (UrbanSound's `signal.to(self.device)` in
`__getitem__`): noted per line with the Dataset's class (`samples`), a copy per sample (PD004), and
its loaders' batches are on the device already (PD003 stands down). O(1) per call, but for a move of
an untracked tensor at the user's line, which walks up to 60 frames to see whether it runs in the loader's
fetch; nothing while dynamo traces; nothing stored on tensors.

A host tensor kept across steps and moved again on every step (`kept`: a diffusion model's noise
schedule made once in `__init__`, `self.alphas.to(x.device)[t]` in every training step; a mask or a
table kept on the host) is the same tensor object moved at the same line on at least
`MIN_KEPT_STEPS` watched steps. Left out: a parameter, a module's registered buffer (`model.to(device)`
moved it: on the GPU the move is a no-op; found at the end through the referrers of the buffers
dict) and a line that stores the move back where the tensor came from (`self.t = self.t.to(dev)`: moved
once, then kept on the device). The same holds where the step reaches the kept tensor through a fresh
alias of it: `nn.Parameter(self.pe, requires_grad=False).to(device)` in every forward wraps the host
table in a new, unregistered Parameter each call (`Parameter.__new__` notes the tensor it wraps: the
move counts as that tensor's), and `x.new_tensor(self.offsets)` turns a host array (numpy or a tensor)
kept across steps into a tensor on the device of `x`, a copy every call where `x` is the model's
computation or a tensor the step moved to its device (pytorch-fm's field offsets: the run notes what
`.to(device)` / `.cuda()` return while watching). So does a selection of a kept host tensor by a kept
host index (`labels[idx_train].to(device)` in every step, GCNII's, both left on the host: one
`_Selection` object per (tensor, index) pair stands for the rows, so the same rows moved on every step
are kept; a new index every step, a replay buffer's random rows, is a new selection each time). The factory wrappers stay installed, inert, until the run ends (TorchScript knows them
as the aten ops they wrap: `torch.jit.script` of code calling `torch.randn` still compiles); the
Tensor methods are put back when the watch ends.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
import weakref
from typing import Any

from perfdoctor.capture import sites
from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.contracts.run import HostFactoryWatch, HostTensorRecord
from perfdoctor.usercode import is_user_file

# torch's functions that allocate on the CPU unless given device= (as the static read's, less
# tensor and as_tensor: they copy data the host computed, an environment's reward or a numpy array,
# which must cross to the device however the tensor is made; the static read flags a literal's)
FACTORIES = ("randn", "rand", "randint", "randperm", "zeros", "ones", "full", "empty", "arange", "linspace",
             "logspace", "eye", "normal", "triu_indices", "tril_indices")
# Steps watched after the first. Few: while the Tensor methods are wrapped, the training steps run slower
# than bare (measured: a DDP rank making 30,000 Python objects per step went from 20 to 41 ms per step;
# the cause is not found yet); the first steps are the warm-up the statistics drop.
WATCH_STEPS = 3
MAX_MADE = 10_000  # tensors remembered per step
# Tensor methods that return the tensor in another dtype, on the host still: what a cast returns is
# followed to its move (`batch_x.float().to(device)`, `torch.randn(n).half().cuda()`)
CASTS = ("float", "double", "half", "bfloat16", "long", "int", "short", "char", "byte", "bool")
# Tensor arithmetic whose result, on the host, carries a factory's tensor to its move: keon's denoising
# autoencoder draws `noise = torch.randn(img.size()) * 0.2`, adds it to the loader's batch on the
# host and moves the sum (`(img + noise).view(-1, 784).to(device)`)
ARITHMETIC = ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__")
# Tensor methods that return the same data in a new tensor, on the host still (a copy where the layout
# asks for one): followed as a cast is, for a factory's tensor and a loader's batch alike (pytorch-book's
# poetry model moves `data_.long().transpose(1, 0).contiguous()`, its loader's batch)
COPIES = ("contiguous", "clone", "reshape", "flatten", "repeat")
# Tensor methods and torch functions that build a mask or a pattern out of a tensor: the result carries
# a factory's tensor to its move, as arithmetic does (a causal mask made every step,
# `(torch.triu(torch.ones(n, n)) == 1).transpose(0, 1).float().masked_fill(...)`, then `.to(device)`)
MASKING = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__invert__", "__and__", "__or__",
           "logical_not", "masked_fill", "triu", "tril")
MASKING_FUNCTIONS = ("triu", "tril")  # torch's own, installed with the factories
MAX_PAIRS = 200  # (factory line, move line) pairs kept
MIN_KEPT_STEPS = 2  # watched steps on which one host tensor kept across steps is moved at a line
MAX_KEPT = 16  # host tensors followed per move line
MAX_ALIASES = 1_000  # fresh Parameters (of a host tensor) and moved tensors remembered per step
MAX_MADE_LINES = 2_000  # the user's factory lines noted over the watch (`watch_record`)
MAX_FILLING = 64  # the user's functions noted filling a host tensor element by element (`watch_record`)
_KEEP: list[Any] = []  # every wrapper ever registered with TorchScript: its id() must stay its own


class _Pair:
    __slots__ = ("site", "moved", "factory", "how", "moves", "steps", "last", "nbytes", "loader", "non_blocking")

    def __init__(self, site: Any, moved: Any, factory: str, how: str, nbytes: int, loader: int | None):
        self.site, self.moved, self.factory, self.how, self.nbytes = site, moved, factory, how, nbytes
        self.loader = loader
        self.moves = self.steps = 0
        self.last = -1
        self.non_blocking: bool | None = None


class _Kept:
    """One host tensor, made before the step that moves it, moved at one line."""

    __slots__ = ("ref", "how", "nbytes", "moves", "steps", "last", "non_blocking")

    def __init__(self, ref: Any, how: str, nbytes: int):
        self.ref, self.how, self.nbytes = ref, how, nbytes
        self.moves = self.steps = 0
        self.last = -1
        self.non_blocking = True


class _Sample:
    """A Dataset's move of each sample to the device at one line (inside the DataLoader's fetch)."""

    __slots__ = ("how", "nbytes", "dataset", "moves", "steps", "last")

    def __init__(self, how: str, nbytes: int, dataset: str | None):
        self.how, self.nbytes, self.dataset = how, nbytes, dataset
        self.moves = self.steps = 0
        self.last = -1


class _Selection:
    """The rows a kept host index selects from a kept host tensor (`labels[idx_train]`): one object per
    (tensor, index) pair across the steps, so that moving the selection on every step is a kept move."""

    __slots__ = ("nbytes", "__weakref__")

    def __init__(self, nbytes: int):
        self.nbytes = nbytes


class HostTensorProbe:
    def __init__(self, torch: Any, err: ErrorLog):
        self.torch = torch
        self.err = err
        self.patches = Patches()  # the factories
        self.methods = Patches()  # the Tensor methods, while watching
        self.on = False
        self.done = False
        self.step = 0
        self.until = 0
        self.main = threading.get_ident()
        self.made: dict[int, tuple[weakref.ref, Any, str]] = {}  # id() -> (ref, (id of its code, line), factory)
        self.pairs: dict[tuple, _Pair] = {}
        self.site_of: dict[tuple, Any] = {}  # (id of a code object, line) -> Site
        self.codes: dict[int, Any] = {}  # id() -> the code objects of the lines noted
        self.watched = 0
        self.kept: dict[tuple[int, int], dict[int, _Kept]] = {}  # (id of a code, line) -> id() -> the tensor
        self.samples: dict[tuple[int, int], _Sample] = {}  # (id of a code, line) -> a Dataset's per-sample move there
        self.made_lines: set[tuple[int, int]] = set()  # (id of a code, line) of every factory call noted
        self.alias: dict[int, tuple[weakref.ref, Any]] = {}  # id() of a fresh Parameter -> (ref, the host tensor it wraps)
        self.on_device: dict[int, weakref.ref] = {}  # id() -> what `.to(device)` / `.cuda()` returned this step
        self.param_new: Any = None  # Parameter.__new__ as the class holds it, while it is wrapped
        self.fills: dict[int, set] = {}  # id() of a factory's tensor -> the distinct numbers written into it (up to 2)
        self.filling: dict[int, Any] = {}  # id() -> the code of a user function that wrote the host's values into one
        self.lines_complete = True
        self.move_lines: set[tuple[int, int]] = set()  # (id of a code, line) of every move of the user's
        self.moves_complete = True
        self.selections: dict[tuple, tuple[Any, list, _Selection]] = {}  # (id of a table, ids of its index) -> refs, selection

    # -- the factories (installed for the whole run, active while watching) ----------------------
    def install(self) -> None:
        torch, probe = self.torch, self
        compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
        get_ident, getframe = threading.get_ident, sys._getframe
        register = getattr(getattr(getattr(torch, "jit", None), "_builtins", None), "_register_builtin", None)
        def wrap(orig: Any, name: str) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                # compiling() first: a constant True to dynamo, which then guards on nothing of the probe's
                if compiling() or not probe.on or get_ident() != probe.main or "device" in kwargs or "generator" in kwargs:
                    return orig(*args, **kwargs)  # (a host generator cannot draw on a device: not the user's to change)
                out = orig(*args, **kwargs)
                probe._made(out, getframe(1), name)
                return out
            return wrapper

        def derive(orig: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                out = orig(*args, **kwargs)
                if args and probe.made and not compiling() and get_ident() == probe.main:
                    probe._arithmetic(args[0], None, out)
                return out
            return wrapper

        for name in FACTORIES + MASKING_FUNCTIONS:
            orig = getattr(torch, name, None)
            if orig is None:
                continue
            wrapper = derive(orig) if name in MASKING_FUNCTIONS else wrap(orig, name)
            self.patches.replace(torch, name, wrapper)
            _KEEP.append(wrapper)
            if register is not None:
                register(wrapper, f"aten::{name}")
        os.register_at_fork(after_in_child=self._forked)

    def uninstall(self) -> None:
        self._stop()
        self.patches.undo()

    def _forked(self) -> None:
        self.on = False
        self.done = True
        self.made = {}

    def _made(self, out: Any, frame: Any, factory: str) -> None:
        try:
            if not isinstance(out, self.torch.Tensor) or not out.is_cpu:
                return
            if not is_user_file(frame.f_code.co_filename):
                return
            code = frame.f_code
            self.codes[id(code)] = code  # keeps the id its own
            key = (id(code), frame.f_lineno)
            if key not in self.made_lines:
                if len(self.made_lines) < MAX_MADE_LINES:
                    self.made_lines.add(key)
                else:
                    self.lines_complete = False
            if len(self.made) < MAX_MADE:
                self.made[id(out)] = (weakref.ref(out), key, factory)
        except Exception as e:  # noqa: BLE001
            self.err("host_tensors", e)

    # -- the moves (while watching) --------------------------------------------------------------
    def _watch(self) -> None:
        torch, probe = self.torch, self
        T = torch.Tensor
        compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
        getframe = sys._getframe
        orig_to, orig_cuda, orig_type_as = T.to, T.cuda, T.type_as
        orig_getitem, orig_setitem = T.__getitem__, T.__setitem__

        def to(t: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling():
                return orig_to(t, *args, **kwargs)
            if _to_device(torch, args, kwargs):
                probe._moved(t, getframe(1), "to", _non_blocking(args, kwargs))
                return probe._on_device(orig_to(t, *args, **kwargs))
            out = orig_to(t, *args, **kwargs)  # a dtype only: the copy is the same host tensor
            if probe.made:
                probe._cast(t, out)
            return out

        def cuda(t: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling():
                return orig_cuda(t, *args, **kwargs)
            probe._moved(t, getframe(1), "cuda", _non_blocking(args, kwargs))
            return probe._on_device(orig_cuda(t, *args, **kwargs))

        def type_as(t: Any, other: Any) -> Any:
            if not compiling():
                probe._moved(t, getframe(1), "type_as")
            return orig_type_as(t, other)

        orig_new_tensor = T.new_tensor

        def new_tensor(t: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
            if not compiling() and "device" not in kwargs:
                probe._new_tensor(t, data, getframe(1))
            return orig_new_tensor(t, data, *args, **kwargs)

        P = torch.nn.Parameter
        self.param_new = vars(P).get("__new__")
        orig_param_new = P.__new__

        def param_new(cls: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig_param_new(cls, *args, **kwargs)
            if not compiling():
                probe._wrapped(out, args[0] if args else kwargs.get("data"))
            return out

        def getitem(t: Any, idx: Any) -> Any:
            if compiling():
                return orig_getitem(t, idx)
            if probe.made or isinstance(idx, (tuple, list, range)) or type(idx).__module__ == "numpy":
                probe._indexed(t, idx, getframe(1))
            out = orig_getitem(t, idx)
            probe._selected(t, idx, out)
            return out

        def setitem(t: Any, idx: Any, value: Any) -> Any:
            if probe.made and not compiling():
                frame = getframe(1)
                probe._indexed(t, idx, frame)
                probe._filled(t, value, frame.f_code)
            return orig_setitem(t, idx, value)

        def cast(orig: Any) -> Any:
            def method(t: Any, *args: Any, **kwargs: Any) -> Any:
                out = orig(t, *args, **kwargs)
                if not compiling() and probe.made:
                    probe._cast(t, out)
                return out
            setattr(method, "__wrapped__", orig)  # noqa: B010
            return method

        def arithmetic(orig: Any) -> Any:
            def method(t: Any, *args: Any, **kwargs: Any) -> Any:
                out = orig(t, *args, **kwargs)
                if probe.made and not compiling():
                    probe._arithmetic(t, args[0] if args else None, out)
                return out
            setattr(method, "__wrapped__", orig)  # noqa: B010
            return method

        for f, o in ((to, orig_to), (cuda, orig_cuda), (type_as, orig_type_as), (getitem, orig_getitem),
                     (setitem, orig_setitem), (new_tensor, orig_new_tensor)):
            setattr(f, "__wrapped__", o)  # noqa: B010
        self.methods.replace(T, "new_tensor", new_tensor)
        if isinstance(self.param_new, staticmethod):
            P.__new__ = staticmethod(param_new)  # put back as it was in _stop
        else:
            self.param_new = None
        self.methods.replace(T, "to", to)
        self.methods.replace(T, "__getitem__", getitem)
        self.methods.replace(T, "__setitem__", setitem)
        self.methods.replace(T, "cuda", cuda)
        self.methods.replace(T, "type_as", type_as)
        for name in CASTS + COPIES:
            orig = getattr(T, name, None)
            if orig is not None:
                self.methods.replace(T, name, cast(orig))
        for name in ARITHMETIC + MASKING:
            orig = getattr(T, name, None)
            if orig is not None:
                self.methods.replace(T, name, arithmetic(orig))
        self.on = True

    def _stop(self) -> None:
        self.on = False
        self.methods.undo()
        if self.param_new is not None:
            self.torch.nn.Parameter.__new__ = self.param_new
            self.param_new = None
        self.made = {}
        self.alias = {}
        self.on_device = {}
        self.fills = {}

    def tag(self, batch: Any, loader: int) -> None:
        """While watching, on the main thread: the host tensors of a DataLoader's batch (a few levels
        into lists, tuples, dicts), as made by that loader (its record's id)."""
        if not self.on or threading.get_ident() != self.main:
            return
        T, todo = self.torch.Tensor, [batch]
        for _ in range(64):
            if not todo or len(self.made) >= MAX_MADE:
                break
            b = todo.pop()
            if isinstance(b, T):
                if b.is_cpu:
                    self.made[id(b)] = (weakref.ref(b), (0, loader), "")
            elif isinstance(b, (list, tuple)):
                todo.extend(b[:16])
            elif isinstance(b, dict):
                todo.extend(list(b.values())[:16])

    def _entry(self, t: Any) -> tuple | None:
        """What made `t`, or the tensor `t` is a view of: (ref, the factory's (code id, line) or a
        loader's (0, id), factory name); None when neither was noted."""
        e = self.made.get(id(t))
        if e is None or e[0]() is not t:
            base = t._base
            e = self.made.get(id(base)) if base is not None else None
            if e is None or e[0]() is not base:
                return None
        return e

    def _cast(self, t: Any, out: Any) -> None:
        """`out` is `t` in another dtype (`batch_x.float()`, `.to(torch.float32)`), still on the host:
        it is what made `t` made, so its later `.to(device)` is that tensor's (or batch's) move."""
        try:
            if out is t or len(self.made) >= MAX_MADE or not isinstance(out, self.torch.Tensor) or not out.is_cpu:
                return
            e = self._entry(t)
            if e is not None:
                self.made[id(out)] = (weakref.ref(out), e[1], e[2])
        except Exception as ex:  # noqa: BLE001
            self.err("host_tensors", ex)

    def _arithmetic(self, t: Any, other: Any, out: Any) -> None:
        """`out = t <op> other` on the host, where a factory made `t` or `other` (or what either is a
        view of): `out` carries that factory's tensor, so its later `.to(device)` is the factory's move
        (the batch plus host noise, moved: PD004 at the noise's line). Only a factory's: what is
        computed from a loader's batch alone stays untracked, as before."""
        try:
            if len(self.made) >= MAX_MADE or not isinstance(out, self.torch.Tensor) or not out.is_cpu:
                return
            for x in (t, other):
                e = self._entry(x) if isinstance(x, self.torch.Tensor) else None
                if e is not None and e[2]:
                    self.made[id(out)] = (weakref.ref(out), e[1], e[2])
                    return
        except Exception as ex:  # noqa: BLE001
            self.err("host_tensors", ex)

    def _filled(self, t: Any, value: Any, code: Any) -> None:
        """`t[idx] = value` where a factory of the step made `t` (or what `t` is a view of): values the
        host computed (a host array or tensor no factory of the step made, or a second distinct number)
        make it a buffer of the host's data, noted from then on as a batch (its move is the data path),
        and `code`, the function writing them, one that builds data on the host (`filling`)."""
        try:
            if self._fills_host(t, value) and id(code) not in self.filling and len(self.filling) < MAX_FILLING \
                    and is_user_file(code.co_filename):
                self.filling[id(code)] = code
        except Exception as ex:  # noqa: BLE001
            self.err("host_tensors", ex)

    def _fills_host(self, t: Any, value: Any) -> bool:
        """`_filled`'s test, True where this write makes `t` a buffer of the host's data (a loader's batch,
        or a buffer already marked, is not made one again: writing into a batch is no filling)."""
        e = self._entry(t)
        if e is None or not e[2]:
            return False
        owner = e[0]()
        if owner is None:
            return False
        T = self.torch.Tensor
        if isinstance(value, T):
            if not value.is_cpu:
                return False
            if value.numel() != 1:
                v = self._entry(value)
                if v is None or not v[2]:  # not a factory's: data the host had
                    self.made[id(owner)] = (e[0], (0, 0), "")
                    return True
                return False
            value = value.item()
        elif not isinstance(value, (int, float, bool)):
            if type(value).__module__ == "numpy" and getattr(value, "ndim", 1) == 0:
                value = value.item()
            elif isinstance(value, (list, tuple)) or type(value).__module__ == "numpy":
                self.made[id(owner)] = (e[0], (0, 0), "")
                return True
            else:
                return False
        seen = self.fills.setdefault(id(owner), set())
        if len(seen) < 2:
            seen.add(value)
        if len(seen) >= 2:
            self.made[id(owner)] = (e[0], (0, 0), "")
            return True
        return False

    def _indexed(self, t: Any, idx: Any, frame: Any) -> None:
        """`t[idx]` or `t[idx] = v` at the user's line: where `t` is the model's computation (it needs
        a gradient or has one coming: on the GPU where the script trains there) and an index is a host
        tensor the step made (`torch.triu_indices(t, t)` for a causal mask), each call copies that
        index to the device: the pair of lines counts as a move ("index")."""
        try:
            if not (t.requires_grad or t.grad_fn is not None):
                return
            T = self.torch.Tensor
            # a list holding tensors or arrays is torch's old spelling of a tuple index; a list of numbers is one index
            parts = idx if isinstance(idx, tuple) or (isinstance(idx, list) and any(
                isinstance(x, T) or type(x).__module__ == "numpy" and getattr(x, "ndim", 0) >= 1
                for x in idx[:8])) else (idx,)
            for x in parts:
                # a 0-dim integer tensor indexes as a Python int (torch reads its value on the host): no copy
                if isinstance(x, T) and x.is_cpu and x.dim() > 0 and self._entry(x) is not None:
                    self._moved(x, frame, "index")
                    return  # one copy per call: `idx[0], idx[1]` of one host tensor is one move
            arrays = [x for x in parts if type(x).__module__ == "numpy" and getattr(x, "ndim", 0) >= 1
                      and getattr(getattr(x, "dtype", None), "kind", "") in ("i", "u", "b")]
            lists = [x for x in parts if _index_list(x)]
            if arrays or lists:
                self._numpy_index(arrays, frame, lists)
        except Exception as e:  # noqa: BLE001
            self.err("host_tensors", e)

    def _numpy_index(self, arrays: list, frame: Any, lists: list | None = None) -> None:
        """Numpy index arrays into the model's computation at the user's line (SASRec's
        `pos_logits[np.where(pos != 0)]`), or Python lists and ranges of indices (HGCN's
        `output[idx_train]`, a split kept as a list): torch makes host index tensors of them and copies
        them to the device on every call. The indexing line is both the pair's site and its move
        (factory "numpy", or "list" where only lists index)."""
        code = frame.f_code
        if threading.get_ident() != self.main or not is_user_file(code.co_filename):
            return
        line = (id(code), frame.f_lineno)
        kind = "numpy" if arrays else "list"
        p = self.pairs.get(((kind, *line), line))
        if p is None:
            if len(self.pairs) >= MAX_PAIRS:
                return
            self.codes[id(code)] = code
            site = self._site(*line)
            nbytes = sum(int(a.nbytes) for a in arrays) + 8 * sum(len(x) for x in lists or ())
            p = self.pairs[((kind, *line), line)] = _Pair(site, site, kind, "index", nbytes, None)
        p.moves += 1
        if p.last != self.step:
            p.last = self.step
            p.steps += 1

    def _selected(self, t: Any, idx: Any, out: Any) -> None:
        """`out = t[idx]` on the host, where `t` is a host tensor the step did not make (a table kept
        across steps) and the index host tensors the step did not make either (full slices and `...`
        beside them): a move of `out` counts as a move of that selection, one object per (table, index)
        pair, so the same rows moved on every step are a kept host tensor moved every step (GCNII's
        `labels[idx_train].to(device)`, both left on the host: move them once). A new index every step
        (random rows of a store) is a new selection every step; a moving slice is left alone."""
        try:
            T = self.torch.Tensor
            if (not isinstance(out, T) or not out.is_cpu or not t.is_cpu or t.requires_grad
                    or threading.get_ident() != self.main or len(self.alias) >= MAX_ALIASES):
                return
            parts = idx if isinstance(idx, tuple) else (idx,)
            kept = [x for x in parts if isinstance(x, T)]
            if not kept or any(not (isinstance(x, T) or x is Ellipsis or (
                    isinstance(x, slice) and x.start is None and x.stop is None and x.step is None)) for x in parts):
                return
            if any(not x.is_cpu or self._entry(x) is not None for x in kept) or self._entry(t) is not None:
                return
            key = (id(t), *(id(x) for x in kept))
            sel = self.selections.get(key)
            if sel is None or sel[0]() is not t or any(r() is not x for r, x in zip(sel[1], kept, strict=True)):
                if len(self.selections) >= MAX_ALIASES:
                    return
                sel = self.selections[key] = (weakref.ref(t), [weakref.ref(x) for x in kept],
                                              _Selection(int(out.numel() * out.element_size())))
            self.alias[id(out)] = (weakref.ref(out), sel[2])
        except Exception as e:  # noqa: BLE001
            self.err("host_tensors", e)

    def _on_device(self, out: Any) -> Any:
        """Note what a move returned (on this CPU, often the tensor itself): a tensor on the script's
        device, whose `new_tensor` copies host data there."""
        try:
            if threading.get_ident() == self.main and len(self.on_device) < MAX_ALIASES:
                self.on_device[id(out)] = weakref.ref(out)
        except Exception as e:  # noqa: BLE001
            self.err("host_tensors", e)
        return out

    def _wrapped(self, param: Any, data: Any) -> None:
        """`nn.Parameter(data)` made while watching: a new tensor around `data`'s memory. Where `data`
        is a host tensor, a move of the Parameter is a move of `data` (kept across steps or not)."""
        try:
            if (isinstance(data, self.torch.Tensor) and data.is_cpu and threading.get_ident() == self.main
                    and len(self.alias) < MAX_ALIASES):
                self.alias[id(param)] = (weakref.ref(param), data)
        except Exception as e:  # noqa: BLE001
            self.err("host_tensors", e)

    def _new_tensor(self, t: Any, data: Any, frame: Any) -> None:
        """`t.new_tensor(data)` at the user's line: where `t` is on the script's device (the model's
        computation, or what a move returned) and `data` a host array or tensor, the call copies `data`
        there: a factory's tensor of this step is that factory's move; the same `data` on every step is
        a host tensor kept across steps, moved every step."""
        try:
            if threading.get_ident() != self.main:
                return
            if isinstance(data, self.torch.Tensor):
                if not data.is_cpu:
                    return
            elif type(data).__module__ != "numpy" or not hasattr(data, "nbytes"):
                return  # a list or a number is rebuilt every call: the host computed it, it must cross
            if t.requires_grad or t.grad_fn is not None or self._was_moved(t) or (
                    t._base is not None and self._was_moved(t._base)):
                if isinstance(data, self.torch.Tensor):
                    self._moved(data, frame, "new_tensor")  # a factory's of this step (Conv-TasNet's frame
                else:                                       # index), else one kept across steps
                    self._kept_move(data, frame, "new_tensor", False)
        except Exception as e:  # noqa: BLE001
            self.err("host_tensors", e)

    def _was_moved(self, t: Any) -> bool:
        ref = self.on_device.get(id(t))
        return ref is not None and ref() is t

    def _moved(self, t: Any, frame: Any, how: str, non_blocking: bool = False) -> None:
        try:
            if how != "index":
                self._move_line(frame)
            e = self._entry(t)
            if e is None:
                if how in ("to", "cuda") and self._sample_move(t, frame, how):
                    return
                if how != "type_as":
                    self._kept_move(t, frame, how, non_blocking)
                return
            code = frame.f_code
            key = (e[1], (id(code), frame.f_lineno))
            p = self.pairs.get(key)
            if p is None:
                if (len(self.pairs) >= MAX_PAIRS or threading.get_ident() != self.main
                        or not is_user_file(code.co_filename)):
                    return
                self.codes[id(code)] = code
                loader = e[1][1] if not e[2] else None  # a batch's tensors: (0, the loader's id)
                p = self.pairs[key] = _Pair(None if loader is not None else self._site(*e[1]),
                                            self._site(id(code), frame.f_lineno), e[2], how,
                                            int(t.numel() * t.element_size()), loader)
            p.moves += 1
            p.non_blocking = non_blocking if p.non_blocking is None else (p.non_blocking and non_blocking)
            if p.last != self.step:
                p.last = self.step
                p.steps += 1
        except Exception as ex:  # noqa: BLE001
            self.err("host_tensors", ex)

    def _move_line(self, frame: Any) -> None:
        """Note the user's line of a `.to(device)` / `.cuda()` / `.type_as()` call on the main thread,
        whatever the tensor: a move line of the user's not among them did not run in the watched steps."""
        code = frame.f_code
        key = (id(code), frame.f_lineno)
        if key in self.move_lines or threading.get_ident() != self.main or not is_user_file(code.co_filename):
            return
        if len(self.move_lines) >= MAX_MADE_LINES:
            self.moves_complete = False
            return
        self.codes[id(code)] = code
        self.move_lines.add(key)

    def _sample_move(self, t: Any, frame: Any, how: str) -> bool:
        """A move at the user's line inside the DataLoader's fetch, in a method of a Dataset (or a function
        one calls): each sample copied to the device as it is read (UrbanSound's `signal.to(self.device)`
        in `__getitem__`). Noted per line with the Dataset's class; True where it is one."""
        code = frame.f_code
        if threading.get_ident() != self.main or not is_user_file(code.co_filename):
            return False
        below = sites.loader_frames(frame)  # one walk: whether in the fetch, and the Dataset's method in it
        if below is None:
            return False
        owners = (f.f_locals.get("self") for f in below)
        dataset = next((type(o).__name__ for o in owners if isinstance(o, self.torch.utils.data.Dataset)), None)
        key = (id(code), frame.f_lineno)
        k = self.samples.get(key)
        if k is None:
            if len(self.samples) >= MAX_KEPT:
                return True
            self.codes[id(code)] = code
            nbytes = int(t.numel() * t.element_size()) if isinstance(t, self.torch.Tensor) else 0
            k = self.samples[key] = _Sample(how, nbytes, dataset)
        k.moves += 1
        if k.last != self.step:
            k.last = self.step
            k.steps += 1
        return True

    def _kept_move(self, t: Any, frame: Any, how: str, non_blocking: bool) -> None:
        """A host tensor the step did not make (nor a DataLoader's batch), or a host array, moved at the
        user's line. A fresh Parameter made around a host tensor counts as that tensor."""
        a = self.alias.get(id(t))
        if a is not None and a[0]() is t:
            t = a[1]
        if ((isinstance(t, self.torch.Tensor) and (not t.is_cpu or isinstance(t, self.torch.nn.Parameter)))
                or threading.get_ident() != self.main or not is_user_file(frame.f_code.co_filename)):
            return
        code = frame.f_code
        line = self.kept.setdefault((id(code), frame.f_lineno), {})
        k = line.get(id(t))
        if k is None or k.ref() is not t:
            if len(line) >= MAX_KEPT:
                return
            self.codes[id(code)] = code
            nbytes = int(t.numel() * t.element_size()) if isinstance(t, self.torch.Tensor) else int(t.nbytes)
            k = line[id(t)] = _Kept(weakref.ref(t), how, nbytes)
        k.moves += 1
        k.non_blocking = k.non_blocking and non_blocking
        if k.last != self.step:
            k.last = self.step
            k.steps += 1

    def watch_record(self) -> HostFactoryWatch | None:
        """The steps watched and the user's lines where a watched factory made a host tensor in them;
        None where no step was watched."""
        if not self.watched:
            return None
        return HostFactoryWatch(watched=self.watched, made=[self._site(*k) for k in self.made_lines],
                                complete=self.lines_complete, moved=[self._site(*k) for k in self.move_lines],
                                moves_complete=self.moves_complete,
                                filled=[f"{os.path.basename(c.co_filename)}({c.co_firstlineno}): {c.co_name}"
                                        for c in self.filling.values()])

    def _kept_records(self) -> list[HostTensorRecord]:
        """One record per move line whose tensor was moved on MIN_KEPT_STEPS watched steps: the line's
        own test first (a move stored back), then the heap scan for a module's buffer per tensor."""
        out = []
        for (code_id, line), tensors in self.kept.items():
            often = [k for k in tensors.values() if k.steps >= MIN_KEPT_STEPS]
            if not often:
                continue
            moved = self._site(code_id, line)
            if _stored_back(moved.code):
                continue
            for k in often:
                t = k.ref()
                if t is not None and _module_buffer(t):
                    continue
                out.append(HostTensorRecord(moved=moved, how=k.how, moves=k.moves, steps=k.steps,
                                            watched=max(self.watched, k.steps), nbytes=k.nbytes,
                                            non_blocking=k.non_blocking, kept=True))
                break  # one record per line
        return out

    def _site(self, code_id: int, line: int) -> Any:
        s = self.site_of.get((code_id, line))
        if s is None:
            code = self.codes[code_id]
            fn = os.path.abspath(code.co_filename)
            s = self.site_of[(code_id, line)] = sites.Site(file=fn, line=line, code=linecache.getline(fn, line).strip(),
                                                         function=code.co_name)
        return s

    # -- per step ---------------------------------------------------------------------------------
    def end_step(self, i: int) -> None:
        """The step clock ended step `i`: forget its tensors; watch from the first step's end on."""
        if self.done:
            return
        self.made = {}
        self.alias = {}
        self.on_device = {}
        self.fills = {}
        if self.on:
            self.watched += 1  # step i was watched to its end
            if i >= self.until:
                self._stop()
                self.done = True
                return
        else:
            self._watch()
            self.until = i + WATCH_STEPS
        self.step = i + 1

    def records(self) -> list[HostTensorRecord]:
        return [HostTensorRecord(site=p.site, moved=p.moved, factory=p.factory, how=p.how, moves=p.moves,
                                 steps=p.steps, watched=max(self.watched, p.steps), nbytes=p.nbytes, loader=p.loader,
                                 non_blocking=p.non_blocking)
                for p in self.pairs.values()] + self._kept_records() + [
            HostTensorRecord(moved=self._site(*key), how=k.how, moves=k.moves, steps=k.steps,
                             watched=max(self.watched, k.steps), nbytes=k.nbytes, dataset=k.dataset or "Dataset")
            for key, k in self.samples.items()]


def _module_buffer(t: Any) -> bool:
    """Whether `t` is a registered buffer of a module: a dict holding it is some module's `_buffers`
    (`model.to(device)` moves those; a plain attribute stays where it was made)."""
    import gc

    for d in gc.get_referrers(t):
        if isinstance(d, dict) and any(isinstance(o, dict) and o.get("_buffers") is d for o in gc.get_referrers(d)):
            return True
    return False


def _stored_back(code: str) -> bool:
    """`self.t = self.t.to(device)`, `t = t.cuda()`: the move's result replaces the host tensor (moved
    once; on the GPU the next step's move is a no-op)."""
    import ast

    try:
        node = ast.parse(code.strip()).body[0]
    except (SyntaxError, IndexError, ValueError):
        return False
    if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
        return False
    f = node.value.func
    while isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call) and f.attr not in ("to", "cuda"):
        f = f.value.func
    if not (isinstance(f, ast.Attribute) and f.attr in ("to", "cuda")):
        return False
    source = ast.unparse(f.value)
    return any(ast.unparse(t) == source for t in node.targets)


# entries a Python list or range must have to count as an index array the data gave (a split's
# indices), not a few positions written in the code (`x[:, [2, 1, 0]]`)
MIN_LIST_INDEX = 16


def _index_list(x: Any) -> bool:
    """A Python list of integers (or a range) long enough to be an index array (`MIN_LIST_INDEX`)."""
    if isinstance(x, range):
        return len(x) >= MIN_LIST_INDEX
    return (isinstance(x, list) and len(x) >= MIN_LIST_INDEX
            and all(type(v) in (int, bool) or type(v).__module__ == "numpy" for v in x[:8]))


def _non_blocking(args: tuple, kwargs: dict) -> bool:
    return bool(kwargs.get("non_blocking", any(a is True for a in args)))


def _to_device(torch: Any, args: tuple, kwargs: dict) -> bool:
    """Whether `Tensor.to(*args, **kwargs)` names a device (a device, a device string, another
    tensor), not only a dtype."""
    if "device" in kwargs:
        return True
    a = args[0] if args else kwargs.get("other")
    return isinstance(a, (str, int, torch.device, torch.Tensor))
