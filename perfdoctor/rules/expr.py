"""A small, safe expression language for rule conditions and saving estimates.

Expressions are parsed with `ast` and walked node by node over a whitelist; nothing is ever
passed to `eval`. Names are fact names (`dataloader.wait_ms` parses as an attribute chain and
is looked up as the dotted name) or rule thresholds (`threshold.min_wait_ms`). A name whose fact
was not measured raises `Missing`, so a rule over an unmeasured fact does not fire; `has(x)` asks
whether it was measured and `get(x, default)` reads it with a default.

Limits (a project's rule files are input too; each keeps an expression's cost bounded):
`MAX_SOURCE` characters of source, `MAX_DEPTH` levels of nesting, `MAX_POW` as an exponent,
integers of at most `MAX_INT_BITS` bits (constants and every result: `(9**64)**64` is refused, not
computed), `round()` to at most `MAX_ROUND_DIGITS` digits either side, strings of at most
`MAX_STR` characters, and `MAX_EVAL_S` seconds per evaluation. Going past one is a RuleError.
"""

from __future__ import annotations

import ast
import math
import operator
import time
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from perfdoctor.errors import RuleError

MAX_SOURCE = 2000
MAX_DEPTH = 40
MAX_POW = 64
MAX_INT_BITS = 256  # about 77 decimal digits: far beyond any measured quantity
MAX_ROUND_DIGITS = 20
MAX_STR = 10_000
# What stops an expression that runs away: at most MAX_NODES node evaluations (each on bounded values), and
# as a backstop MAX_EVAL_S of the thread's CPU time. Never the wall clock: on a busy machine a thread
# kept off the CPU, or a garbage collection of a large process inside the evaluation, is not an
# expression that runs away, and the report must not fail for it (a wall-clock 0.25 s did under load).
MAX_NODES = 200_000
MAX_EVAL_S = 5.0


class Missing(Exception):
    """A name in the expression has no value (the fact was not measured)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


def _num(*xs: Any) -> None:
    for x in xs:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise TypeError(f"expected a number, got {type(x).__name__}")


def _fn_min(*a: Any) -> Any:
    _num(*a)
    return min(a)


def _fn_max(*a: Any) -> Any:
    _num(*a)
    return max(a)


def _fn_clamp(x: Any, lo: Any, hi: Any) -> Any:
    _num(x, lo, hi)
    return max(lo, min(hi, x))


def _fn_round(x: Any, n: Any = 0) -> Any:
    _num(x, n)
    if not -MAX_ROUND_DIGITS <= n <= MAX_ROUND_DIGITS:
        raise RuleError(f"round() takes at most {MAX_ROUND_DIGITS} digits")
    return round(x, int(n))


def _fn_ceil(x: Any) -> int:
    _num(x)
    return math.ceil(x)


def _fn_floor(x: Any) -> int:
    _num(x)
    return math.floor(x)


def _fn_abs(x: Any) -> Any:
    _num(x)
    return abs(x)


def _fn_human_bytes(x: Any) -> str:
    _num(x)
    v = float(x)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(v) < 1024 or unit == "TB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TB"  # pragma: no cover


def _fn_pct(x: Any) -> str:
    _num(x)
    return f"{100 * x:.0f}%"


def _fn_str(x: Any) -> str:
    if not isinstance(x, (int, float, str, bool)):
        raise TypeError("str() takes a plain value")
    if isinstance(x, float) and math.isfinite(x) and abs(x) < 1e15 and x == int(x):
        return str(int(x))
    return str(x)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "human_bytes": _fn_human_bytes,
    "pct": _fn_pct,
    "str": _fn_str,
    "min": _fn_min,
    "max": _fn_max,
    "clamp": _fn_clamp,
    "round": _fn_round,
    "ceil": _fn_ceil,
    "floor": _fn_floor,
    "abs": _fn_abs,
}
# `has(x)` and `get(x, default)` are special: `has(x)` tests whether the fact x was measured, and
# `get(x, default)` is x's value, or `default` (evaluated only then) where x was not measured; neither
# raises Missing for x. `get(script.targets_cuda, false)` is the flag where it was read, false where not.
SPECIAL = {"has", "get"}
CONSTANTS = {"true": True, "false": False, "True": True, "False": False}


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _check(node: ast.AST, depth: int = 0) -> None:
    """Reject anything outside the whitelist, before any evaluation."""
    if depth > MAX_DEPTH:
        raise RuleError("expression nests too deeply")
    if isinstance(node, ast.Expression):
        return _check(node.body, depth + 1)
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float, str, bool)) or node.value is None:
            raise RuleError(f"constant {str(node.value)[:40]!r} is not allowed")
        if isinstance(node.value, int) and node.value.bit_length() > MAX_INT_BITS:
            raise RuleError(f"integer constant over {MAX_INT_BITS} bits")
        if isinstance(node.value, str) and len(node.value) > 200:
            raise RuleError("string constant too long")
        return
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = _dotted(node)
        if name is None or "__" in name:
            raise RuleError("only fact names (a.b.c) may be referenced")
        return
    if isinstance(node, ast.BoolOp):
        for v in node.values:
            _check(v, depth + 1)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
        return _check(node.operand, depth + 1)
    if isinstance(node, ast.BinOp) and (type(node.op) in _BINOPS or isinstance(node.op, ast.Pow)):
        _check(node.left, depth + 1)
        _check(node.right, depth + 1)
        return
    if isinstance(node, ast.Compare) and all(type(o) in _CMPOPS for o in node.ops):
        _check(node.left, depth + 1)
        for c in node.comparators:
            _check(c, depth + 1)
        return
    if isinstance(node, ast.IfExp):
        for n in (node.test, node.body, node.orelse):
            _check(n, depth + 1)
        return
    if isinstance(node, (ast.Tuple, ast.List)):
        if len(node.elts) > 50:
            raise RuleError("literal list too long")
        for e in node.elts:
            _check(e, depth + 1)
        return
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS.keys() | SPECIAL:
            raise RuleError(f"only the functions {', '.join(sorted(FUNCTIONS.keys() | SPECIAL))} may be called")
        if node.keywords:
            raise RuleError("keyword arguments are not allowed")
        if node.func.id == "has":
            if len(node.args) != 1 or _dotted(node.args[0]) is None:
                raise RuleError("has() takes one fact name")
            return
        if node.func.id == "get":
            if len(node.args) != 2 or _dotted(node.args[0]) is None:
                raise RuleError("get() takes a fact name and a default")
            return _check(node.args[1], depth + 1)
        for a in node.args:
            _check(a, depth + 1)
        return
    raise RuleError(f"{type(node).__name__} is not allowed in a rule expression")


@lru_cache(maxsize=512)
def compile_expr(source: str) -> ast.Expression:
    """Parse and vet an expression; raises RuleError for anything not allowed."""
    if not isinstance(source, str):
        raise RuleError("an expression must be a string")
    if len(source) > MAX_SOURCE:
        raise RuleError("expression too long")
    if not source.strip():
        raise RuleError("empty expression")
    try:
        # parenthesised so that rule files may break long expressions over several lines
        tree = ast.parse("(" + source.strip() + "\n)", mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise RuleError(f"cannot parse expression {source[:80]!r}: {' '.join(str(e).split())[:120]}") from None
    _check(tree)
    return tree


def evaluate(source: str, lookup: Callable[[str], Any] | Mapping[str, Any]) -> Any:
    """Evaluate an expression. `lookup(name)` returns a value or raises Missing (a Mapping works too).

    Raises Missing when a needed fact is absent, RuleError when the expression is not allowed or
    fails (division by zero, wrong types)."""
    tree = compile_expr(source)
    if isinstance(lookup, Mapping):
        mapping = lookup

        def lookup(name: str) -> Any:  # noqa: F811 - wraps the mapping
            if name in mapping:
                return mapping[name]
            raise Missing(name)

    try:
        return _eval(tree.body, lookup, [MAX_NODES, time.thread_time() + MAX_EVAL_S])
    except Missing:
        raise
    except RuleError as e:
        raise RuleError(f"expression {source[:80]!r}: {e.message}") from None
    except (ArithmeticError, TypeError, ValueError, RecursionError) as e:
        raise RuleError(f"expression {source[:80]!r} failed: {' '.join(str(e).split())[:120]}") from None


def _bounded(v: Any) -> Any:
    """`v`, unless it is an integer or a string past the limits."""
    if type(v) is int and v.bit_length() > MAX_INT_BITS:
        raise RuleError(f"an integer over {MAX_INT_BITS} bits")
    if type(v) is str and len(v) > MAX_STR:
        raise RuleError(f"a string over {MAX_STR} characters")
    return v


def _pow(a: Any, b: Any) -> Any:
    _num(a, b)
    if abs(b) > MAX_POW:
        raise RuleError("exponent too large")
    if type(a) is int and type(b) is int and b > 0 and a.bit_length() * b > MAX_INT_BITS + b:
        raise RuleError(f"an integer over {MAX_INT_BITS} bits")
    v = a**b
    if isinstance(v, complex):
        raise ValueError("a negative number to a fractional power")
    return v


def _eval(node: ast.AST, lookup: Callable[[str], Any], budget: list) -> Any:
    """`budget`: [node evaluations left, the thread CPU time at which it is spent]."""
    budget[0] -= 1
    if budget[0] < 0:
        raise RuleError(f"evaluation took over {MAX_NODES} steps")
    if budget[0] % 1024 == 0 and time.thread_time() > budget[1]:
        raise RuleError(f"evaluation took over {MAX_EVAL_S} s of CPU time")
    return _bounded(_eval_node(node, lookup, budget))


def _eval_node(node: ast.AST, lookup: Callable[[str], Any], deadline: list) -> Any:
    def ev(n: ast.AST) -> Any:
        return _eval(n, lookup, deadline)

    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = _dotted(node)
        assert name is not None
        if name in CONSTANTS:
            return CONSTANTS[name]
        return lookup(name)
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            result: Any = True
            for v in node.values:
                result = ev(v)
                if not result:
                    return result
            return result
        result = False
        for v in node.values:
            result = ev(v)
            if result:
                return result
        return result
    if isinstance(node, ast.UnaryOp):
        v = ev(node.operand)
        if isinstance(node.op, ast.Not):
            return not v
        _num(v)
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.BinOp):
        a, b = ev(node.left), ev(node.right)
        if isinstance(node.op, ast.Pow):
            return _pow(a, b)
        if isinstance(a, str) or isinstance(b, str):
            if isinstance(node.op, ast.Add) and isinstance(a, str) and isinstance(b, str):
                return a + b
            raise TypeError("arithmetic on strings")
        _num(a, b)
        return _BINOPS[type(node.op)](a, b)
    if isinstance(node, ast.Compare):
        left = ev(node.left)
        for op, comp in zip(node.ops, node.comparators):
            right = ev(comp)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return ev(node.body) if ev(node.test) else ev(node.orelse)
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(ev(e) for e in node.elts)
    if isinstance(node, ast.Call):
        fname = node.func.id  # type: ignore[attr-defined]
        if fname == "has":
            try:
                lookup(_dotted(node.args[0]))  # type: ignore[arg-type]
                return True
            except Missing:
                return False
        if fname == "get":
            try:
                return lookup(_dotted(node.args[0]))  # type: ignore[arg-type]
            except Missing:
                return ev(node.args[1])
        return FUNCTIONS[fname](*(ev(a) for a in node.args))
    raise RuleError(f"{type(node).__name__} is not allowed")  # unreachable after _check


def names_in(source: str) -> set[str]:
    """The fact names an expression reads (for evidence and docs)."""
    tree = compile_expr(source)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute)):
            n = _dotted(node)
            if n and n not in CONSTANTS and n not in FUNCTIONS and n not in SPECIAL:
                # only the outermost chain counts: skip the inner parts of a.b.c
                out.add(n)
    # drop prefixes of longer names (a.b from a.b.c)
    return {n for n in out if not any(o != n and o.startswith(n + ".") for o in out)}
