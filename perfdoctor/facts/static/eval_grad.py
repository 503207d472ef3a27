"""Evaluation forwards with autograd on (PD019): a function that puts a model in eval mode
(`model.eval()`) and then calls it, with no `torch.no_grad()` / `torch.inference_mode()` around the
call, none decorating the function and none around any of its calls in the file, and no backward in
the function (a model kept in eval mode while it trains, to freeze BatchNorm, is not an
evaluation). One `eval_grad` subject per such call, with `eval_grad.in_source`; a function the
file never calls is left out (its callers, elsewhere, may turn grad mode off)."""

from __future__ import annotations

import ast

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.syntax import dotted, walk_scope

NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad",
                     "torch.autograd.grad_mode.no_grad", "torch.autograd.grad_mode.inference_mode",
                     "torch.set_grad_enabled"})
BACKWARD = frozenset({"backward", "grad"})  # .backward(), torch.autograd.grad / backward


def detect(index: SourceIndex, facts: Facts) -> None:
    for fn in index.nodes:
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _no_grad_decorated(index, fn):
            _function(index, facts, fn)


def _is_no_grad(index: SourceIndex, node: ast.AST) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return index.qual(target) in NO_GRAD


def _no_grad_decorated(index: SourceIndex, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(_is_no_grad(index, d) for d in fn.decorator_list)


def _under_no_grad(index: SourceIndex, node: ast.AST, stop: ast.AST | None) -> bool:
    """A `with torch.no_grad():` (or inference_mode) encloses `node`, inside `stop` (None: anywhere)."""
    for n in index.ancestors(node):
        if n is stop:
            return False
        if isinstance(n, (ast.With, ast.AsyncWith)) and any(_is_no_grad(index, it.context_expr) for it in n.items):
            return True
    return False


def _function(index: SourceIndex, facts: Facts, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    calls = [n for n in walk_scope(fn.body) if isinstance(n, ast.Call)]
    evals: dict[str, int] = {}  # receiver as written -> the first line it is put in eval mode
    for c in calls:
        if isinstance(c.func, ast.Attribute) and c.func.attr in BACKWARD:
            return
        if isinstance(c.func, ast.Attribute) and c.func.attr == "eval" and not c.args and not c.keywords:
            name = dotted(c.func.value)
            if name is not None:
                evals.setdefault(name, c.lineno)
    if not evals:
        return
    forwards = [c for c in calls if (name := dotted(c.func)) is not None and name in evals
                and c.lineno > evals[name] and not _under_no_grad(index, c, fn)]
    if not forwards:
        return
    callers = index.calls_named(fn.name)
    if not callers or any(_under_no_grad(index, c, None) for c in callers):
        return
    for c in forwards:
        put(index.subject(facts, "eval_grad", c), "in_source", True)
