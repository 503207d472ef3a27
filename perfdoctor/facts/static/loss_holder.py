"""Loss tensors kept across steps (PD006): in a loop that `.backward()`s a name, a statement that
keeps that same tensor (not `.item()`, not `.detach()`) in a list, a running sum or a meter. One
`loss_holder` subject per such statement, with the holder's `kind` ("list", "running-sum",
"attribute"), the `holder` as written and the `tensor_name`."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.syntax import LOOPS, dotted, root_name, walk_scope

_LIST_METHODS = frozenset({"append", "extend", "insert"})
_HOLDER_METHODS = frozenset({"update", "add", "record", "accumulate", "push", "put"})


def detect(index: SourceIndex, facts: Facts) -> None:
    for node in index.nodes:
        if isinstance(node, LOOPS):
            _loop(index, facts, node)


def _loop(index: SourceIndex, facts: Facts, loop: ast.For | ast.AsyncFor | ast.While) -> None:
    body = list(walk_scope(loop.body))
    assigns: dict[str, list[int]] = {}  # name -> lines where the loop (re)binds it
    backward: list[tuple[str, int]] = []  # (name, line) of what is `.backward()`-ed
    for n in body:
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                for m in ast.walk(t):
                    if isinstance(m, ast.Name):
                        assigns.setdefault(m.id, []).append(n.lineno)
        elif isinstance(n, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
            for t in ([n.target] if isinstance(n, (ast.For, ast.AsyncFor)) else
                      [i.optional_vars for i in n.items if i.optional_vars is not None]):
                for m in ast.walk(t):
                    if isinstance(m, ast.Name):
                        assigns.setdefault(m.id, []).append(n.lineno)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward":
            src = n.args[0] if n.args else n.func.value
            for m in ast.walk(src):
                if isinstance(m, ast.Name):
                    backward.append((m.id, n.lineno))

    def last_bind(name: str, line: int) -> int | None:
        before = [ln for ln in assigns.get(name, []) if ln < line]
        return max(before) if before else None

    losses = {(name, last_bind(name, line)) for name, line in backward if last_bind(name, line) is not None}
    for n in body:
        if not isinstance(n, ast.stmt):
            continue
        found = _holder(n)
        if found is None:
            continue
        kind, holder_node, refs = found
        for ref in refs:
            if (ref.id, last_bind(ref.id, n.lineno)) in losses and root_name(holder_node) != ref.id:
                s = index.subject(facts, "loss_holder", n)
                put(s, "kind", kind)
                put(s, "holder", index.text(holder_node))
                put(s, "tensor_name", ref.id)
                break


def _holder(n: ast.stmt) -> tuple[str, ast.expr, list[ast.Name]] | None:
    """(kind, holder node, bare names it takes) for `X.append(a)`, `X += a`, `X = X + a`, `m.update(a)`."""
    if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute):
        call, func = n.value, n.value.func
        attr = func.attr
        if attr in _LIST_METHODS:
            kind = "list"
        elif attr == "add_":
            kind = "running-sum"
        elif attr in _HOLDER_METHODS:
            kind = "attribute"
        else:
            return None
        refs = [m for a in call.args for m in _bare_names(a)]
        return kind, func.value, refs
    if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add):
        return "running-sum", n.target, list(_bare_names(n.value))
    if (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.value, ast.BinOp)
            and isinstance(n.value.op, ast.Add)):
        target = dotted(n.targets[0])
        leaves = list(_bare_names(n.value))
        if target and "." not in target and any(m.id == target for m in leaves):
            return "running-sum", n.targets[0], [m for m in leaves if m.id != target]
    return None


def _bare_names(node: ast.AST) -> Iterator[ast.Name]:
    """Names reached through arithmetic, tuples and lists only (not inside calls or attributes)."""
    if isinstance(node, ast.Name):
        yield node
    elif isinstance(node, ast.BinOp):
        yield from _bare_names(node.left)
        yield from _bare_names(node.right)
    elif isinstance(node, ast.UnaryOp):
        yield from _bare_names(node.operand)
    elif isinstance(node, (ast.Tuple, ast.List)):
        for e in node.elts:
            yield from _bare_names(e)
