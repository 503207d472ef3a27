"""The global fact `script.uses_amp`: do the files train in low precision on some path? A call of
`torch.autocast` / `torch.amp.autocast` / `torch.cuda.amp.autocast` (wherever it is: nanoGPT
builds it only for CUDA, and that counts), a GradScaler, `.half()` / `.bfloat16()`, a
`dtype=torch.float16 / bfloat16` given to `.to()`, or a 16-bit precision setting (Lightning's
`precision="16-mixed"` / `"bf16-mixed"`, accelerate's `mixed_precision="bf16"`). The union over the
files, as for `script.targets_cuda`.

An autocast or GradScaler switched by a setting of the user's (`enabled=args.amp`, Pytorch-UNet's
`--amp`, off by default) is not low precision on every path: it is on where the user turns it on, and
the run's forward shows whether this run did (`autocast.enabled`). So is one built only under such a
setting (`if args.amp: amp_autocast = partial(torch.autocast, ...)`, timm's train.py), and a `.half()` or
16-bit setting in such a branch (Transformer-XL's `if args.fp16: model = model.half()`, `--fp16` a
`store_true`). A device test
(`enabled=device.type == "cuda"`, `if device == "cuda":`) is not such a setting: on the GPU the script
targets it is on; nor is a flag whose argparse default in the same file turns it on. An autocast with
`enabled=False` is an fp32 island inside low-precision code, not low precision; a GradScaler alone
scales fp16 gradients that an autocast or `.half()` elsewhere makes, so it is not evidence by itself
(a library's scaler class in the user's tree, never built by the run, made timm's fp32 default count
as AMP)."""

from __future__ import annotations

import ast
import re

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, add_union
from perfdoctor.facts.static.index.settings import in_user_branch, setting
from perfdoctor.facts.static.index.syntax import kwarg

_FACT = "script.uses_amp"
_AUTOCAST = frozenset({"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast"})
_LOW_METHODS = frozenset({"half", "bfloat16"})
_LOW_DTYPES = frozenset({"torch.float16", "torch.half", "torch.bfloat16"})
_PRECISION = re.compile(r"^(bf)?16(-mixed|-true)?$|^(fp16|bf16)$")


def _switched(index: SourceIndex, node: ast.AST, call: ast.Call | None) -> bool:
    """Whether the low precision at `node` is off unless a user's setting turns it on: its own
    `enabled=` (False, or a setting off by default), or an `if` / conditional expression on a setting
    around it, in the branch that runs only where the user changes the setting."""
    if call is not None:
        enabled = kwarg(call, "enabled")
        if isinstance(enabled, ast.Constant) and not enabled.value:
            return True  # an fp32 island
        if setting(index, enabled) is False:
            return True
    return in_user_branch(index, node)


def _uses_amp(index: SourceIndex) -> bool:
    for call in index.calls:
        q = index.qual(call.func)
        if q in _AUTOCAST or (q or "").endswith(".autocast"):
            if not _switched(index, call, call):
                return True
            continue  # on where the user turns it on: the run shows whether this run did (PD007)
        for a in call.args:  # handed on, not called here: partial(torch.autocast, device_type=...)
            if index.qual(a) in _AUTOCAST and not _switched(index, a, call if q == "functools.partial" else None):
                return True
        if _low_precision(index, call) and not in_user_branch(index, call):
            return True
    return False


def _low_precision(index: SourceIndex, call: ast.Call) -> bool:
    """`.half()` / `.bfloat16()`, `.to(dtype=torch.float16)`, or a 16-bit precision setting."""
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr in _LOW_METHODS and not call.args:
        return True
    if isinstance(f, ast.Attribute) and f.attr == "to":
        dt = kwarg(call, "dtype")
        if dt is not None and index.qual(dt) in _LOW_DTYPES:
            return True
    for name in ("precision", "mixed_precision"):
        v = kwarg(call, name)
        if isinstance(v, ast.Constant) and _PRECISION.match(str(v.value).lower()):
            return True
    return False


def detect(index: SourceIndex, facts: Facts) -> None:
    add_union(facts, _FACT, _uses_amp(index), "the files use autocast or 16-bit precision", "no autocast or 16-bit precision in the files")
