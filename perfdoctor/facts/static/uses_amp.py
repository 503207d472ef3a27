"""The global fact `script.uses_amp`: do the files train in low precision on some path? A call of
`torch.autocast` / `torch.amp.autocast` / `torch.cuda.amp.autocast` (wherever it is: nanoGPT
builds it only for CUDA, and that counts), a GradScaler, `.half()` / `.bfloat16()`, a
`dtype=torch.float16 / bfloat16` given to `.to()`, or a 16-bit precision setting (Lightning's
`precision="16-mixed"` / `"bf16-mixed"`, accelerate's `mixed_precision="bf16"`). The union over the
files, as for `script.targets_cuda`.

An autocast or GradScaler switched by a setting of the user's (`enabled=args.amp`, Pytorch-UNet's
`--amp`, off by default) is not low precision on every path: it is on where the user turns it on, and
the run's forward shows whether this run did (`autocast.enabled`). A device test (`enabled=device.type
== "cuda"`) is not such a setting: on the GPU the script targets it is on."""

from __future__ import annotations

import ast
import re

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, add_union
from perfdoctor.facts.static.index.syntax import kwarg

_FACT = "script.uses_amp"
_AUTOCAST = frozenset({"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast",
                       "torch.amp.GradScaler", "torch.cuda.amp.GradScaler", "torch.GradScaler"})
_LOW_METHODS = frozenset({"half", "bfloat16"})
_LOW_DTYPES = frozenset({"torch.float16", "torch.half", "torch.bfloat16"})
_PRECISION = re.compile(r"^(bf)?16(-mixed|-true)?$|^(fp16|bf16)$")


_DEVICE_WORDS = re.compile(r"cuda|device|gpu|is_available", re.I)


def _a_setting(index: SourceIndex, node: ast.expr | None, depth: int = 0) -> bool:
    """`enabled=args.amp`, `enabled=amp`, `enabled=not cfg.fp32`: a switch the user sets, not a test of
    the device (`enabled=device.type == "cuda"`, `use_amp = args.amp and torch.cuda.is_available()`),
    which would be on for the GPU the script targets."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _a_setting(index, node.operand, depth)
    if isinstance(node, ast.Attribute):
        return not _DEVICE_WORDS.search(ast.unparse(node))
    if isinstance(node, ast.Name) and not _DEVICE_WORDS.search(node.id):
        values = index.assigned.get(node.id, [])
        return depth < 3 and all(not _DEVICE_WORDS.search(ast.unparse(v)) and (
            not isinstance(v, (ast.Name, ast.Attribute, ast.UnaryOp)) or _a_setting(index, v, depth + 1))
            for v in values)
    return False


def _uses_amp(index: SourceIndex) -> bool:
    for call in index.calls:
        q = index.qual(call.func)
        if q in _AUTOCAST or (q or "").endswith((".autocast", ".GradScaler")):
            if _a_setting(index, kwarg(call, "enabled")):
                continue  # on where the user turns it on: the run shows whether this run did (PD007)
            return True
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
