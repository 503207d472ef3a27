"""The module trees the training step calls (PD016, PD023, PD028, PD034), library models included.

Where each convolution and Linear was built: `_ConvNd.__init__` and `Linear.__init__` are wrapped (on the class, once; nothing is
put on the layer) and notes the first frame of the user's code, and whether that frame built the
layer itself (`layers.append(nn.Conv2d(...))`) or called a library's model builder that did
(`torchvision.models.resnet18()`). At the first call of each top-level module the forward probe
follows, `tree` reads its module tree: how many modules of each class, and its convolutions
grouped by the line that built them, with their bias, parameters and the memory layout of their
weights, and the Linear and convolution layers whose matmul dimensions are not multiples of 8,
grouped the same way with their names in the tree (FlopCounterMode's, "Net.fc1"). On the first forward of that module that torch neither traces nor compiles, `Watch` sees
its submodule calls: the memory layout of each convolution's input, and which convolution's output
a BatchNorm was called on (the dataflow `nn.Sequential(*layers)` or any forward builds, in any
file). The weights' layout is read again when the first steps are over (`refresh`), after a
`model.to(memory_format=torch.channels_last)` that follows a first call.

Cost: one frame walk per convolution built; one walk of the tree per top-level module; a dict
lookup per submodule call of one forward per module. Bookkeeping is keyed by `id()` and checked
through weak references.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections import Counter
from typing import Any

from perfdoctor.capture import sites
from perfdoctor.capture.patches import ErrorLog, Patches
from perfdoctor.contracts.run import ConvGroup, ForwardRecord, LayerGroup, ModuleTree
from perfdoctor.usercode import is_user_file

MAX_BUILT = 100_000  # convolutions whose construction line is kept
MAX_CLASSES = 64  # classes kept in a tree's layer counts
MAX_GROUPS = 64  # construction lines of misaligned layers kept per tree
MAX_NAMES = 256  # module names kept per line (FlopCounterMode's, to add up their FLOPs)


class ModuleProbe:
    def __init__(self, torch: Any, err: ErrorLog):
        self.torch = torch
        self.err = err
        self.patches = Patches()
        self.torch_dir = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
        # id() of a convolution -> (weak reference, the site that built it, built directly there)
        self.built: dict[int, tuple[weakref.ref, Any, bool]] = {}
        # the trees read so far and their convolutions: (tree, [(weak ref to a conv, its group)])
        self.trees: list[tuple[ModuleTree, list[tuple[weakref.ref, ConvGroup]]]] = []

    def install(self) -> None:
        from torch.nn.modules import batchnorm, conv, linear

        self.conv_cls, self.norm_cls, self.linear_cls = conv._ConvNd, batchnorm._BatchNorm, linear.Linear
        for cls in (conv._ConvNd, linear.Linear):
            self._wrap_init(cls)

    def _wrap_init(self, cls: Any) -> None:
        orig, probe = cls.__init__, self

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            probe._built(self)

        self.patches.replace(cls, "__init__", __init__)

    def uninstall(self) -> None:
        self.patches.undo()

    def _built(self, mod: Any) -> None:
        try:
            if len(self.built) >= MAX_BUILT:
                return
            f: Any = sys._getframe(2)  # who called the wrapper: a torch subclass's __init__ or the user's line
            while f is not None and os.path.realpath(f.f_code.co_filename).startswith(self.torch_dir):
                f = f.f_back  # torch's own subclasses' __init__
            direct = f is not None and is_user_file(f.f_code.co_filename)
            self.built[id(mod)] = (weakref.ref(mod), sites.site_of(sites.user_frame(f)), direct)
        except Exception as e:  # noqa: BLE001
            self.err("modules", e)

    def _site(self, m: Any) -> tuple[Any, bool]:
        b = self.built.get(id(m))
        return (b[1], b[2]) if b is not None and b[0]() is m else (None, False)

    def _tree(self, mod: Any) -> tuple[ModuleTree, list[tuple[weakref.ref, ConvGroup]]]:
        """The tree of a top-level module and its convolutions (never while torch traces: sizes are traced values then)."""
        counts: Counter[str] = Counter()
        groups: dict[tuple, ConvGroup] = {}
        members: list[tuple[weakref.ref, ConvGroup]] = []
        misaligned: dict[tuple, LayerGroup] = {}
        top = type(mod).__name__
        for name, m in mod.named_modules():
            counts[type(m).__name__] += 1
            self._aligned(m, f"{top}.{name}" if name else top, misaligned)
            if isinstance(m, self.conv_cls):
                site, direct = self._site(m)
                layer = type(m).__name__
                key = (site.file, site.line, layer) if site is not None else (None, 0, layer)
                g = groups.get(key)
                if g is None:
                    g = groups[key] = ConvGroup(site=site, direct=direct, layer=layer,
                                                dims=len(getattr(m, "kernel_size", ())) or 2,
                                                in_channels=int(getattr(m, "in_channels", 0) or 0))
                g.count += 1
                g.bias += getattr(m, "bias", None) is not None
                g.pointwise += _matmul_conv(m)
                g.in_channels = min(g.in_channels, int(getattr(m, "in_channels", 0) or 0))
                g.params += _numel(m)
                g.weights_channels_last += self._channels_last(getattr(m, "weight", None))
                members.append((weakref.ref(m), g))
        tree = ModuleTree(modules=sum(counts.values()), layers=dict(counts.most_common(MAX_CLASSES)),
                          convs=list(groups.values()), misaligned=list(misaligned.values())[:MAX_GROUPS])
        return tree, members

    def _aligned(self, m: Any, name: str, into: dict[tuple, LayerGroup]) -> None:
        """Note a Linear or convolution whose matmul dimensions are not all multiples of 8 (tensor cores
        need them so in 16-bit), grouped by the line that built it. A convolution's input channels of 4
        or fewer (an image stem: cuDNN has kernels for them) are not counted."""
        if isinstance(m, self.linear_cls):
            dims = (("in_features", m.in_features), ("out_features", m.out_features))
        elif isinstance(m, self.conv_cls):
            groups = int(getattr(m, "groups", 1) or 1)
            dims = (("in_channels", m.in_channels // groups if m.in_channels > 4 else 8),
                    ("out_channels", m.out_channels // groups))
        else:
            return
        odd = [f"{k} {v}" for k, v in dims if isinstance(v, int) and v % 8]
        if not odd:
            return
        site, direct = self._site(m)
        key = (site.file, site.line, type(m).__name__) if site is not None else (None, 0, type(m).__name__)
        g = into.get(key)
        if g is None:
            g = into[key] = LayerGroup(site=site, direct=direct, layer=type(m).__name__)
        g.count += 1
        g.params += _numel(m)
        for d in odd:
            if d not in g.dims and len(g.dims) < 8:
                g.dims.append(d)
        if len(g.names) < MAX_NAMES:
            g.names.append(name)

    def _channels_last(self, t: Any) -> bool:
        """A 4-D tensor in torch.channels_last and not also NCHW-contiguous (a 1x1 kernel of one channel is both)."""
        try:
            return (isinstance(t, self.torch.Tensor) and t.dim() == 4 and not t.is_contiguous()
                    and t.is_contiguous(memory_format=self.torch.channels_last))
        except Exception:  # noqa: BLE001  (an uninitialised lazy parameter, a tensor subclass)
            return False

    def watch(self, mod: Any, rec: ForwardRecord) -> Watch | None:
        """Read the tree of the followed module `mod` into its record and watch this forward's
        submodule calls; None while torch traces (jit.trace, add_graph: a later call will do)."""
        try:
            if self.torch.jit.is_tracing():
                return None
            tree, members = self._tree(mod)
        except Exception as e:  # noqa: BLE001
            self.err("modules", e)
            return None
        rec.tree = tree
        self.trees.append((tree, members))
        return Watch(self, tree, {id(m()): (m, g) for m, g in members if m() is not None})

    def refresh(self) -> None:
        """The first steps are over: read the convolutions' weight layouts again."""
        try:
            for _, members in self.trees:
                for g in {id(g): g for _, g in members}.values():
                    g.weights_channels_last = 0
                for ref, g in members:
                    g.weights_channels_last += self._channels_last(getattr(ref(), "weight", None))
        except Exception as e:  # noqa: BLE001
            self.err("modules", e)


class Watch:
    """One forward's submodule calls: each convolution's input layout, and conv -> BatchNorm (the conv's
    output unchanged: not after an in-place add or activation on it)."""

    def __init__(self, probe: ModuleProbe, tree: ModuleTree, convs: dict[int, tuple[weakref.ref, ConvGroup]]):
        self.probe = probe
        self.tree = tree
        self.convs = convs
        self.seen: dict[int, bool] = {}  # id() of a conv called -> its input was channels_last
        self.fed: set[int] = set()  # id() of the biased convs whose output went into an affine BatchNorm
        # id() of a biased conv's output -> (ref, conv id, its version counter then: an in-place op since,
        # `out += residual` or an in-place ReLU, means the BatchNorm no longer reads the conv's output alone)
        self.outputs: dict[int, tuple[weakref.ref, int, int | None]] = {}
        self.calls = 0

    def call(self, orig: Any, mod: Any, args: tuple, kwargs: dict) -> Any:
        self.calls += 1
        x = args[0] if args else None
        c = self.convs.get(id(mod))
        try:
            if c is not None and c[0]() is mod:
                self.seen[id(mod)] = self.seen.get(id(mod), False) or self.probe._channels_last(x)
            elif x is not None and isinstance(mod, self.probe.norm_cls):
                o = self.outputs.get(id(x))
                if (o is not None and o[0]() is x and getattr(mod, "affine", False)
                        and getattr(x, "_version", None) == o[2]):
                    self.fed.add(o[1])
                    self.convs[o[1]][1].norm = type(mod).__name__
        except Exception as e:  # noqa: BLE001
            self.probe.err("modules", e)
        out = orig(mod, *args, **kwargs)
        if c is not None and c[0]() is mod and getattr(mod, "bias", None) is not None:
            try:
                self.outputs[id(out)] = (weakref.ref(out), id(mod), getattr(out, "_version", None))
            except TypeError:  # not a tensor: nothing to follow
                pass
        return out

    def finish(self) -> None:
        self.tree.watched = self.calls > 0
        self.tree.submodule_calls = self.calls
        for i, cl in self.seen.items():
            g = self.convs[i][1]
            g.inputs_seen += 1
            g.inputs_channels_last += cl
        for i in self.fed:
            self.convs[i][1].bias_into_norm += 1
        self.outputs.clear()


def _numel(m: Any) -> int:
    try:
        return int(sum(p.numel() for p in m.parameters(recurse=False)))
    except Exception:  # noqa: BLE001  (uninitialised lazy parameters)
        return 0


def _matmul_conv(m: Any) -> bool:
    """A convolution that is a matmul: a kernel of one element (1x1), or non-overlapping patches (kernel
    = stride, no padding or dilation: a ViT's patch embedding, each output a linear map of one patch).
    cuDNN has no Winograd or FFT algorithm for either to search for."""
    kernel = tuple(getattr(m, "kernel_size", (0,)))
    if all(k == 1 for k in kernel):
        return True
    pad = getattr(m, "padding", None)
    return (tuple(getattr(m, "stride", ())) == kernel and (pad == "valid" or (isinstance(pad, tuple) and not any(pad)))
            and all(d == 1 for d in getattr(m, "dilation", (1,))))
