"""Host reads of device tensors in the training step (PD008): `.item()`, `.cpu()`, `.numpy()`,
`.tolist()`, `float(t)` / `int(t)` and `print(t)` of a tensor, each a host-device sync on a GPU.

One `host_read` subject per line, with `host_read.kind` (the kinds on that line, e.g. "item" or
"cpu, numpy") and `host_read.in_loop`. Only reads that run on every step count: in a training loop
(a loop whose body, or a function of this file it calls, runs `.backward()`), or in a function that
runs `.backward()` and is called from a loop; a read behind a periodic guard (`if i % log_every == 0:`)
or in an evaluation loop with no backward is left out. A tensor for `float()`, `int()` and `print()`
is a name the step calls `.backward()` on or a loss-like name bound in the loop (`loss`, `d_loss`).
"""

from __future__ import annotations

import ast
import re

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import LOOPS, SourceIndex, put, walk_scope

_METHODS = ("item", "cpu", "numpy", "tolist")
_CASTS = ("float", "int")
_ORDER = (*_METHODS, *_CASTS, "print")
_LOSS_NAME = re.compile(r"(^|_)loss(es)?($|_)|^(err|error)(_|$)", re.I)


def detect(index: SourceIndex, facts: Facts) -> None:
    # step functions: a backward outside any loop of theirs (`def train_step(...)`); a function whose
    # backward is inside its own loop (`def train(epoch)`) is the step loop itself, and a loop that
    # calls it is an epoch loop
    training_fns = {fn.name for fn in index.nodes if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and _runs_backward(fn.body, loops=False)}
    reads: dict[int, tuple[ast.expr, list[str]]] = {}  # line -> (first read node, kinds)
    for node in index.nodes:
        if not isinstance(node, LOOPS) or not _is_training(index, node, training_fns):
            continue
        _reads(index, node.body, node, reads)
    for fn in index.nodes:  # a step function with its own backward, called from a loop
        if (isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in training_fns
                and fn.name in index.called_in_loop):
            _reads(index, fn.body, fn, reads)
    for node, kinds in reads.values():
        s = index.subject(facts, "host_read", node)
        put(s, "kind", ", ".join(sorted(kinds, key=_ORDER.index)))
        put(s, "in_loop", True)


def _runs_backward(body: list[ast.stmt], loops: bool = True) -> bool:
    """A `.backward()` call in `body` (with `loops=False`: not inside a loop of it)."""
    stack: list[ast.AST] = list(body)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward":
            return True
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)) or (
                not loops and isinstance(n, LOOPS)):
            continue
        stack.extend(ast.iter_child_nodes(n))
    return False


def _is_training(index: SourceIndex, loop: ast.AST, training_fns: set[str]) -> bool:
    body = list(walk_scope(loop.body))  # type: ignore[attr-defined]
    if _runs_backward(loop.body):  # type: ignore[attr-defined]
        return True
    return any(isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Name) and n.func.id in training_fns)
        or (isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
            and n.func.value.id in ("self", "cls") and n.func.attr in training_fns)) for n in body)


def _tensor_names(body: list[ast.stmt]) -> set[str]:
    """Names the step backward()s, and loss-like names it binds."""
    out: set[str] = set()
    for n in walk_scope(body):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward":
            target = n.args[0] if n.args else n.func.value
            if isinstance(target, ast.Name):
                out.add(target.id)
        elif isinstance(n, (ast.Assign, ast.AugAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                if isinstance(t, ast.Name) and _LOSS_NAME.search(t.id) and isinstance(n.value, (ast.Call, ast.BinOp)):
                    out.add(t.id)
    return out


def _periodic(index: SourceIndex, node: ast.AST, top: ast.AST) -> bool:
    """Behind an `if` (up to `top`) whose test has a `%`: a read every N steps, not every step."""
    child, parent = node, index.parents.get(node)
    while parent is not None and parent is not top:
        if isinstance(parent, ast.If) and child is not parent.test and any(
                isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mod) for m in ast.walk(parent.test)):
            return True
        child, parent = parent, index.parents.get(parent)
    return False


def _reads(index: SourceIndex, body: list[ast.stmt], top: ast.AST,
           reads: dict[int, tuple[ast.expr, list[str]]]) -> None:
    tensors = _tensor_names(body)
    for n in walk_scope(body):
        if not isinstance(n, ast.Call):
            continue
        kind = None
        f = n.func
        if isinstance(f, ast.Attribute) and f.attr in _METHODS and not n.args and not n.keywords:
            kind = f.attr
        elif isinstance(f, ast.Name) and f.id in _CASTS and len(n.args) == 1 and not n.keywords:
            arg = n.args[0]
            if isinstance(arg, ast.Name) and arg.id in tensors:
                kind = f.id
        elif isinstance(f, ast.Name) and f.id == "print":
            shown = [*n.args, *(v.value for a in n.args if isinstance(a, ast.JoinedStr)
                                for v in a.values if isinstance(v, ast.FormattedValue))]
            if any(isinstance(a, ast.Name) and a.id in tensors for a in shown):
                kind = "print"
        if kind is None or _periodic(index, n, top):
            continue
        first, kinds = reads.setdefault(n.lineno, (n, []))
        if kind not in kinds:
            kinds.append(kind)
