"""Evaluation forwards with autograd on (PD019): a function that puts a model in eval mode
(`model.eval()`) and then calls it, with no `torch.no_grad()` / `torch.inference_mode()` around the
call, none decorating the function and none around any of its calls in the file, and no backward in
the function (a model kept in eval mode while it trains, to freeze BatchNorm, is not an
evaluation). One `eval_grad` subject per such call, with `eval_grad.in_source`; a function the
file never calls is left out (its callers, elsewhere, may turn grad mode off).

Also an evaluation that never calls `.eval()` (a model without dropout or BatchNorm needs none):
a loop over a DataLoader's batches (`dataloader.batch_loops`) in a file whose training loop shows
where the steps are, that takes no step and runs in none (`Loops.in_training_step` False), with no
backward in it, calling a model an optimizer trains (`optim.SGD(net.parameters())`: `net`) with no
no_grad around the call, its function or that function's calls (dragen1860's lesson28:
`for data, target in test_loader: logits = net(data)` after each epoch). The run's probe sees only
eval-mode forwards, so the source speaks for these.
Also a prediction loop over the script's own batches (no DataLoader, no `.eval()`): a loop in a
function with no backward, that takes no training step and runs in none the source can show
(`Loops.in_training_step` not True), calling a model an optimizer trains with no no_grad around it, and
reading a forward's output out of autograd at once (`.detach()`, `.data`, `.cpu()`, `.numpy()`,
`.item()`, `.tolist()` on the call): DA-RNN's `test()` predicting the whole series batch by batch,
`self.Decoder(...).cpu().data.numpy()`. A forward whose output is read out there can feed no backward.
Neither inside an `nn.Module` class the run's models never held and none of whose methods its steps
called (`SourceIndex.module_ran`: DomainBed's other algorithms, each an nn.Module, beside the ERM the
run trains): code the run never executed is no cost of its steps. Nor a call of a function in which
the run's probe watched another line call a module in eval mode (`_judged_by_run`): the run executed
that evaluation and judged it at the line it reached; a line it did not reach is a branch this
configuration never takes (Torch-Pruning's `_trace`, which calls `model(**example_inputs)` only for a
dict of inputs, `model(*example_inputs)` otherwise)."""

from __future__ import annotations

import ast

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.dataloader import DATALOADER, batch_loops
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.syntax import LOOPS, dotted, walk_scope

NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad",
                     "torch.autograd.grad_mode.no_grad", "torch.autograd.grad_mode.inference_mode",
                     "torch.set_grad_enabled"})
BACKWARD = frozenset({"backward", "grad"})  # .backward(), torch.autograd.grad / backward


def detect(index: SourceIndex, facts: Facts) -> None:
    for fn in index.nodes:
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _no_grad_decorated(index, fn):
            _function(index, facts, fn)
    _evaluation_loops(index, facts)
    _read_out_loops(index, facts)


def _trained_models(index: SourceIndex) -> set[str]:
    """The models an optimizer of this file trains, as written: `net` of `optim.SGD(net.parameters())`
    (an optimizer's first argument, or its `params=`)."""
    out: set[str] = set()
    for c in index.calls:
        qual = index.qual(c.func) or ""
        if not qual.startswith("torch.optim."):
            continue
        given = [*c.args[:1], *(k.value for k in c.keywords if k.arg == "params")]
        for g in given:
            for n in ast.walk(g):
                if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "parameters"
                        and (name := dotted(n.func.value)) is not None):
                    out.add(name)
    return out


def _evaluation_loops(index: SourceIndex, facts: Facts) -> None:
    if not index.loops.has_training_loop():
        return
    models = _trained_models(index)
    if not models:
        return
    loops = {id(loop): loop for call in index.calls if index.qual(call.func) in DATALOADER
             for loop, _ in batch_loops(index, call)}
    for loop in loops.values():
        if index.loops.trains(loop) or index.loops.in_training_step(loop) is not False:
            continue
        calls = [n for n in walk_scope(loop.body) if isinstance(n, ast.Call)]  # type: ignore[attr-defined]
        if any(isinstance(c.func, ast.Attribute) and c.func.attr in BACKWARD for c in calls):
            continue
        forwards = [c for c in calls if dotted(c.func) in models and not _under_no_grad(index, c, None)
                    and index.module_ran(c)]
        fn = index.context(loop)[0]
        if not forwards or (isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                _no_grad_decorated(index, fn) or any(_under_no_grad(index, c, None) for c in index.calls_named(fn.name)))):
            continue
        for c in forwards:
            put(index.subject(facts, "eval_grad", c), "in_source", True)


READ_OUT = frozenset({"detach", "data", "cpu", "numpy", "item", "tolist"})


def _read_out_loops(index: SourceIndex, facts: Facts) -> None:
    if not index.loops.has_training_loop():
        return
    models = _trained_models(index)
    if not models:
        return
    for fn in index.nodes_of(ast.FunctionDef, ast.AsyncFunctionDef):
        if _no_grad_decorated(index, fn):
            continue
        scope = list(walk_scope(fn.body))
        if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in BACKWARD
               for c in scope):
            continue
        if any(_under_no_grad(index, c, None) for c in index.calls_named(fn.name)):
            continue
        for loop in scope:
            if not isinstance(loop, LOOPS) or index.loops.trains(loop) or index.loops.in_training_step(loop) is True:
                continue
            body = [n for n in walk_scope(loop.body) if isinstance(n, ast.Call)]
            forwards = [c for c in body if dotted(c.func) in models and not _under_no_grad(index, c, None)
                        and index.module_ran(c)]
            if not any(_read_out(index, c) for c in forwards):
                continue
            for c in forwards:
                put(index.subject(facts, "eval_grad", c), "in_source", True)


def _read_out(index: SourceIndex, call: ast.Call) -> bool:
    """`call`'s value goes out of autograd at once: `model(x).detach()`, `.cpu().data.numpy()`, `.item()`."""
    parent = index.parents.get(call)
    return isinstance(parent, ast.Attribute) and parent.value is call and parent.attr in READ_OUT


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


def _judged_by_run(index: SourceIndex, facts: Facts, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The run's probe watched a line of `fn` call a module in eval mode with grad on (an `eval_grad`
    subject of the run in `fn`'s lines of this file): the run reached this evaluation and judges it."""
    first, last = fn.lineno, fn.end_lineno or fn.lineno
    for s in facts.of_kind("eval_grad"):
        file, _, line = s.key.rpartition(":")
        if (file == str(index.file) and line.isdigit() and first <= int(line) <= last
                and any(f.source != "static" for f in s.facts.values())):
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
                and c.lineno > evals[name] and not _under_no_grad(index, c, fn) and index.module_ran(c)]
    if not forwards or _judged_by_run(index, facts, fn):
        return
    callers = index.calls_named(fn.name)
    if not callers or any(_under_no_grad(index, c, None) for c in callers):
        return
    for c in forwards:
        put(index.subject(facts, "eval_grad", c), "in_source", True)
