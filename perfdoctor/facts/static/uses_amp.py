"""The global fact `script.uses_amp`: do the files train in low precision on some path? A call of
`torch.autocast` / `torch.amp.autocast` / `torch.cuda.amp.autocast` (wherever it is: nanoGPT
builds it only for CUDA, and that counts), a GradScaler, `.half()` / `.bfloat16()`, a
`dtype=torch.float16 / bfloat16` given to `.to()`, or a 16-bit precision setting (Lightning's
`precision="16-mixed"` / `"bf16-mixed"`, accelerate's `mixed_precision="bf16"`). The union over the
files, as for `script.targets_cuda`.

An autocast or GradScaler switched by a setting of the user's (`enabled=args.amp`, Pytorch-UNet's
`--amp`, off by default) is not low precision on every path: it is on where the user turns it on, and
the run's forward shows whether this run did (`autocast.enabled`). So is one built only under such a
setting (`if args.amp: amp_autocast = partial(torch.autocast, ...)`, timm's train.py). A device test
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
from perfdoctor.facts.static.index.syntax import kwarg

_FACT = "script.uses_amp"
_AUTOCAST = frozenset({"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast"})
_LOW_METHODS = frozenset({"half", "bfloat16"})
_LOW_DTYPES = frozenset({"torch.float16", "torch.half", "torch.bfloat16"})
_PRECISION = re.compile(r"^(bf)?16(-mixed|-true)?$|^(fp16|bf16)$")


_DEVICE_WORDS = re.compile(r"cuda|device|gpu|is_available", re.I)


def _setting(index: SourceIndex, node: ast.expr | None, depth: int = 0) -> bool | None:
    """What a user's setting is by default: False where it is off unless the user turns it on
    (`args.amp` with `action="store_true"`, `amp`, `use_amp == "native"` with `use_amp = None` first),
    True where it is on unless turned off (`not args.noamp`, an argparse `default=True`, `amp = True`),
    None where `node` is no setting: a test of the device (`device.type == "cuda"`, `args.amp and
    torch.cuda.is_available()`), which is on for the GPU the script targets."""
    if node is None or depth > 3:
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        v = _setting(index, node.operand, depth)
        return None if v is None else not v
    if isinstance(node, ast.Compare) and all(isinstance(c, ast.Constant) for c in node.comparators):
        left = node.left
        first = _first_value(index, left) if isinstance(left, ast.Name) else None
        if isinstance(first, ast.Constant) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            same = first.value == node.comparators[0].value  # type: ignore[attr-defined]
            return same if isinstance(node.ops[0], ast.Eq) else not same
        return None if _setting(index, left, depth) is None else False
    if isinstance(node, ast.Attribute):
        return None if _DEVICE_WORDS.search(ast.unparse(node)) else _on_by_default(index, node.attr)
    if isinstance(node, ast.Name) and not _DEVICE_WORDS.search(node.id):
        values = index.assigned.get(node.id, [])
        if any(_DEVICE_WORDS.search(ast.unparse(v)) for v in values):
            return None
        first = _first_value(index, node)  # the default: later bindings override it where a setting says
        if isinstance(first, ast.Constant):
            return bool(first.value)
        if isinstance(first, (ast.Name, ast.Attribute, ast.UnaryOp, ast.Compare)):
            return _setting(index, first, depth + 1)
        return False  # a parameter (`amp: bool = False`) or a value read from a config
    return None


def _first_value(index: SourceIndex, name: ast.Name) -> ast.expr | None:
    """The value `name` is bound to first in the file's source order (`assigned` is in walk order)."""
    values = index.assigned.get(name.id, [])
    return min(values, key=lambda v: (v.lineno, v.col_offset)) if values else None


def _on_by_default(index: SourceIndex, dest: str) -> bool:
    """An argparse option of this file stored in `dest` whose default turns it on (`default=True`,
    `action="store_false"`): then `args.<dest>` is on unless the user turns it off."""
    for call in index.calls:
        f = call.func
        if not (isinstance(f, ast.Attribute) and f.attr == "add_argument") or not call.args:
            continue
        flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        d = kwarg(call, "dest")
        name = d.value if isinstance(d, ast.Constant) else next(
            (x.lstrip("-").replace("-", "_") for x in flags if x.startswith("--")), None)
        if name != dest:
            continue
        action, default = kwarg(call, "action"), kwarg(call, "default")
        if isinstance(action, ast.Constant) and action.value == "store_false":
            return True
        return isinstance(default, ast.Constant) and bool(default.value)
    return False


def _switched(index: SourceIndex, node: ast.AST, call: ast.Call | None) -> bool:
    """Whether the low precision at `node` is off unless a user's setting turns it on: its own
    `enabled=` (False, or a setting off by default), or an `if` / conditional expression on a setting
    around it, in the branch that runs only where the user changes the setting."""
    if call is not None:
        enabled = kwarg(call, "enabled")
        if isinstance(enabled, ast.Constant) and not enabled.value:
            return True  # an fp32 island
        if _setting(index, enabled) is False:
            return True
    child: ast.AST = node
    for p in index.ancestors(node):
        if isinstance(p, (ast.If, ast.IfExp)) and child is not p.test:
            on = _setting(index, p.test)
            in_body = any(child is b for b in p.body) if isinstance(p, ast.If) else child is p.body
            if on is not None and on != in_body:
                return True
        if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return False
        child = p
    return False


def _uses_amp(index: SourceIndex) -> bool:
    for call in index.calls:
        q = index.qual(call.func)
        if q in _AUTOCAST or (q or "").endswith(".autocast"):
            if not _switched(index, call, call):
                return True
            continue  # on where the user turns it on: the run shows whether this run did (PD007)
        for a in call.args:  # handed on, not called here: partial(torch.autocast, device_type=...)
            if index.qual(a) in _AUTOCAST and not _switched(index, a, call if index.qual(call.func) == "functools.partial" else None):
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
