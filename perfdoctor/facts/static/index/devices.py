"""Devices and dtypes: what an expression says about where a tensor goes and what the script does on a GPU.

Whether an expression names a (possibly CUDA) device or the CPU (`device_expr`), a dtype
(`is_dtype`), the device a `.to()` / `.cuda()` moves to (`move_target`), a legacy CUDA tensor type
(`cuda_tensor_type`), and the value an expression has when the script runs on a CUDA device
(`on_cuda`: `torch.cuda.is_available()`, `use_cuda`, `args.no_cuda`, `device.type == "cuda"`).
Names are followed through their assignments (`Syntax.assigned`), bounded and memoised.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from typing import Any

from perfdoctor.facts.static.index.syntax import Syntax, dotted, kwarg

DTYPE_NAMES = frozenset({
    "float", "float16", "half", "bfloat16", "float32", "float64", "double", "int", "int8", "int16",
    "int32", "int64", "long", "short", "uint8", "bool", "complex64", "complex128", "cfloat", "cdouble",
    "float8_e4m3fn", "float8_e5m2",
})
# identifiers that name a device: `device`, `self.device`, `dev`, `gpu`, `local_rank`, `rank`
_DEVICE_NAME = re.compile(r"device|(^|_)(dev|gpu|gpus|cuda|rank)(_|$)", re.I)
# flags and names that are true exactly on the accelerator path (`use_cuda`, `args.cuda`, `use_accel`)
# and those true exactly off it (`args.no_cuda`, `use_cpu`)
_ON_CUDA_NAME = re.compile(r"^(use_|has_|with_|is_|on_)?(cuda|gpu|gpus|accel|accelerator)(_available|_enabled)?$", re.I)
_OFF_CUDA_NAME = re.compile(r"^(no_(cuda|gpu|accel|accelerator)|(use_|force_|only_)?cpu(_only)?)$", re.I)
_CUDA_AVAILABLE = frozenset({"torch.cuda.is_available", "torch.accelerator.is_available",
                             "torch.backends.mps.is_available", "torch.xpu.is_available"})
UNKNOWN: Any = object()  # `Devices.on_cuda`: the source does not say
# how deep the readings of a value (`device_expr`, `is_dtype`, `on_cuda`) follow names through their
# assignments, branches and calls: bounded, so that cycles (`device = torch.device(device)`) and deep
# expressions end, and memoised per name and depth (`Devices._by_name`), so that fan-out stays linear
FOLLOW_DEPTH = 6


class Devices:
    """The device and dtype readings of one file's expressions."""

    def __init__(self, syntax: Syntax):
        self.syntax = syntax
        self._memo: dict[tuple[str, str, int], Any] = {}  # `_by_name`

    def _by_name(self, what: str, name: str, depth: int, of_values: Callable[[list[ast.expr]], Any],
                 unsure: Any = None) -> Any:
        """`of_values(the values assigned to name)`, once per (question, name, depth): a name followed
        through its assignments (`device = torch.device(device)`, `a = b; b = a`) costs each question
        at most names x FOLLOW_DEPTH evaluations, whatever the file's cycles and fan-out. While it is
        being worked out, the name reads as `unsure`."""
        key = (what, name, depth)
        if key not in self._memo:
            self._memo[key] = unsure
            self._memo[key] = of_values(self.syntax.assigned.get(name, []))
        return self._memo[key]

    def is_dtype(self, node: ast.AST, depth: int = 0) -> bool:
        q = self.syntax.qual(node)
        if q and q.startswith("torch.") and q[6:] in DTYPE_NAMES:
            return True
        if isinstance(node, ast.Name) and depth < FOLLOW_DEPTH:
            return bool(self._by_name("dtype", node.id, depth,
                                      lambda values: any(self.is_dtype(v, depth + 1) for v in values)))
        return False

    def device_expr(self, node: ast.AST, depth: int = 0) -> bool | None:
        """True: names a (possibly CUDA) device. False: names the CPU. None: not a device / unsure
        (also past FOLLOW_DEPTH names, branches or calls deep)."""
        if depth > FOLLOW_DEPTH:
            return None
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                kind = node.value.split(":")[0].lower()
                if kind in ("cpu", "meta"):
                    return False
                return True if kind in ("cuda", "xpu", "mps", "hpu", "npu") else None
            if isinstance(node.value, int) and not isinstance(node.value, bool):
                return True
            return None
        if isinstance(node, ast.IfExp):
            branches = [self.device_expr(node.body, depth + 1), self.device_expr(node.orelse, depth + 1)]
            return True if True in branches else (False if branches == [False, False] else None)
        if isinstance(node, ast.Call):
            if self.syntax.qual(node.func) == "torch.device":
                return self.device_expr(node.args[0], depth + 1) if node.args else None
            return None
        name = dotted(node)
        if name is None or self.is_dtype(node):
            return None
        if isinstance(node, ast.Name) and node.id in self.syntax.assigned:
            def verdict(values: list[ast.expr]) -> bool | None:
                verdicts = {self.device_expr(v, depth + 1) for v in values}
                return False if verdicts == {False} else (True if True in verdicts else None)
            found = self._by_name("device", node.id, depth, verdict)
            if found is not None:
                return bool(found)
        last = name.rsplit(".", 1)[-1]
        return True if _DEVICE_NAME.search(last) else None

    def on_cuda(self, node: ast.AST, depth: int = 0) -> Any:
        """The value `node` has when the script runs on a CUDA device, where the source says:
        `torch.cuda.is_available()` and flags like `use_cuda` / `args.cuda` are True there,
        `args.no_cuda` False, `device.type == "cuda"` True, constants are themselves, and names
        assigned in the file are followed (all their assignments must agree). `UNKNOWN` otherwise."""
        if depth > FOLLOW_DEPTH:
            return UNKNOWN
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Call):
            q = self.syntax.qual(node.func)
            if q in _CUDA_AVAILABLE:
                return True
            if isinstance(node.func, ast.Name) and node.func.id == "bool" and len(node.args) == 1:
                v = self.on_cuda(node.args[0], depth + 1)
                return UNKNOWN if v is UNKNOWN else bool(v)
            return UNKNOWN
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            v = self.on_cuda(node.operand, depth + 1)
            return UNKNOWN if v is UNKNOWN else not v
        if isinstance(node, ast.BoolOp):
            vals = [self.on_cuda(v, depth + 1) for v in node.values]
            if isinstance(node.op, ast.And):
                if any(v is not UNKNOWN and not v for v in vals):
                    return False
                return True if all(v is not UNKNOWN for v in vals) else UNKNOWN
            if any(v is not UNKNOWN and v for v in vals):
                return True
            return False if all(v is not UNKNOWN for v in vals) else UNKNOWN
        if isinstance(node, ast.IfExp):
            test = self.on_cuda(node.test, depth + 1)
            if test is UNKNOWN:
                body, orelse = self.on_cuda(node.body, depth + 1), self.on_cuda(node.orelse, depth + 1)
                return body if body is not UNKNOWN and body == orelse else UNKNOWN
            return self.on_cuda(node.body if test else node.orelse, depth + 1)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            return self._device_compare(node)
        if isinstance(node, ast.Name) and node.id in self.syntax.assigned:
            def agreed(values: list[ast.expr]) -> Any:
                vals = [self.on_cuda(v, depth + 1) for v in values]
                return vals[0] if vals and all(v is not UNKNOWN for v in vals) and all(v == vals[0] for v in vals) \
                    else UNKNOWN
            value = self._by_name("on_cuda", node.id, depth, agreed, UNKNOWN)
            if value is not UNKNOWN:
                return value
        name = dotted(node)
        if name is not None:
            last = name.rsplit(".", 1)[-1]
            if _ON_CUDA_NAME.match(last):
                return True
            if _OFF_CUDA_NAME.match(last):
                return False
        return UNKNOWN

    def _device_compare(self, node: ast.Compare) -> Any:
        """`device.type == "cuda"`, `args.device != "cpu"`, `"cuda" in str(device)` on a CUDA device."""
        left, op, right = node.left, node.ops[0], node.comparators[0]
        const, other = (right, left) if isinstance(right, ast.Constant) else (left, right)
        if not isinstance(const, ast.Constant) or not isinstance(const.value, str):
            return UNKNOWN
        if isinstance(other, ast.Constant):
            return UNKNOWN
        kind = const.value.split(":")[0].lower()
        if kind not in ("cuda", "cpu"):
            return UNKNOWN
        is_cuda = kind == "cuda"
        if isinstance(op, (ast.Eq, ast.Is, ast.In)):
            return is_cuda
        if isinstance(op, (ast.NotEq, ast.IsNot, ast.NotIn)):
            return not is_cuda
        return UNKNOWN

    def cuda_tensor_type(self, node: ast.AST, depth: int = 0) -> str | None:
        """`FloatTensor` where `node` is, on a CUDA device, a legacy CUDA tensor type:
        `torch.cuda.FloatTensor`, or a name bound to one on the accelerator path
        (`Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`)."""
        if depth > 4:
            return None
        q = self.syntax.qual(node)
        if q and q.startswith("torch.cuda.") and q.endswith("Tensor"):
            return q[len("torch.cuda."):]
        if isinstance(node, ast.IfExp):
            test = self.on_cuda(node.test)
            if test is UNKNOWN:
                return None
            return self.cuda_tensor_type(node.body if test else node.orelse, depth + 1)
        if isinstance(node, ast.Name) and len(self.syntax.assigned.get(node.id, [])) == 1:
            return self.cuda_tensor_type(self.syntax.assigned[node.id][0], depth + 1)
        return None

    def move_target(self, call: ast.Call) -> str | None:
        """For `recv.cuda(...)` / `recv.to(...)`: the device's source text when it moves to a
        (possibly CUDA) device; None for dtype-only casts, CPU targets and anything unsure."""
        f = call.func
        if not isinstance(f, ast.Attribute):
            return None
        if f.attr == "cuda":
            dev = call.args[0] if call.args else kwarg(call, "device")
            return "cuda" if dev is None else self.syntax.text(dev)
        if f.attr != "to":
            return None
        dev = kwarg(call, "device")
        if dev is None and call.args:
            dev = call.args[0]
        if dev is None or self.device_expr(dev) is not True:
            return None
        return self.syntax.text(dev)
