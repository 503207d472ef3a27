"""Evaluation forwards with autograd on (PD019): a call of a model in eval mode, with no
`torch.no_grad()` / `torch.inference_mode()` around the call, none decorating its function and none
around any of that function's calls in the file, and no backward that can run through its graph. In
eval mode: the last `.eval()` / `.train(False)` / `.train()` of that name before the call, in its
function or at the script's top level, put it so; with none there, a call of the function in this file
passed it in eval mode (`model.eval(); test(model, loader)` for `def test(net, loader)`). A backward
can run through it where every loop around the backward also runs the forward and the backward comes
after it or a loop repeats both: a model kept in eval mode while it trains, to freeze BatchNorm (a GAN's
generator step through its discriminator), is no evaluation; an evaluation loop beside the training
loop in one `main()` is. One `eval_grad` subject per such call, with `eval_grad.in_source`; a function
the file never calls is left out (its callers, elsewhere, may turn grad mode off). A helper the
training step calls too with the model in train mode (SR-GNN's `forward(model, i, data)`) is judged at
the evaluation's call of it, where no_grad can go, as the run's probe judges it. Every static subject
asks that the evaluation recur beside the training (`_recurs`: a loop around it, or around a call of its
function in this file or the project's others, trains, itself or through a training function of this
file or of the project's others, `_trains`): a test once after training costs the steps nothing, as the
run's probe judges a line its steady steps never call.

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
from collections.abc import Collection

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.dataloader import DATALOADER, batch_loops
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.syntax import LOOPS, argument, called_name, dotted, walk_scope

NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad",
                     "torch.autograd.grad_mode.no_grad", "torch.autograd.grad_mode.inference_mode",
                     "torch.set_grad_enabled"})
BACKWARD = frozenset({"backward", "grad"})  # .backward(), torch.autograd.grad / backward


def detect(index: SourceIndex, facts: Facts) -> None:
    for fn in index.nodes:
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _no_grad_decorated(index, fn):
            _function(index, facts, fn)
    _module(index, facts)
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
            _flag(index, facts, c)


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
                _flag(index, facts, c)


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


def _judged_by_run(index: SourceIndex, facts: Facts, first: int, last: int) -> bool:
    """The run's probe watched a line of these (a function's, a top-level statement's) call a module in
    eval mode with grad on (an `eval_grad` subject of the run there): the run reached this evaluation
    and judges it."""
    for s in facts.of_kind("eval_grad"):
        file, _, line = s.key.rpartition(":")
        if (file == str(index.file) and line.isdigit() and first <= int(line) <= last
                and any(f.source != "static" for f in s.facts.values())):
            return True
    return False


def _flag(index: SourceIndex, facts: Facts, call: ast.Call) -> None:
    """An `eval_grad` subject with `in_source`, where the evaluation recurs beside training (`_recurs`)."""
    if _recurs(index, call, 0):
        put(index.subject(facts, "eval_grad", call), "in_source", True)


def _recurs(index: SourceIndex, node: ast.AST, depth: int) -> bool:
    """`node` runs again and again beside the training: a loop around it trains (an epoch loop, a training
    loop that evaluates every N steps), or, inside a function, a call of that function in this file does
    (three calls deep). A test once after training costs the steps nothing, as the run's probe judges a
    line its steady steps never call (DropEdge's `test()` after its 400 epochs)."""
    for a in index.ancestors(node):
        if isinstance(a, LOOPS) and _trains(index, a):
            return True
        if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if isinstance(a, ast.Lambda) or depth >= 3:
                return False
            # its calls in this file, or, where none, in the project's other files (DomainBed's train.py
            # calling `evaluate` of its lib/misc.py every N steps)
            calls = [(index, c) for c in index.calls_named(a.name)] or [
                (p.syntax, c) for p in index.loops.peers if isinstance(p.syntax, SourceIndex)
                for c in p.syntax.calls_named(a.name)]
            return any(_recurs(ix, c, depth + 1) for ix, c in calls)
    return False


def _trains(index: SourceIndex, loop: ast.AST) -> bool:
    """`loop` takes training steps: in its body, through a function of this file, or through one of the
    project's other files it calls by name (`for epoch ...: train_epoch(model, loader)` of utils.py)."""
    if index.loops.trains(loop):
        return True
    names = {called_name(n) for n in walk_scope(loop.body) if isinstance(n, ast.Call)}  # type: ignore[attr-defined]
    return any(names & p.training_functions() for p in index.loops.peers)


def _mode_call(call: ast.Call) -> tuple[str, bool] | None:
    """(receiver as written, True for eval mode) of `m.eval()`, `m.train(False)`, `m.train()`; a
    `m.train(flag)` the source cannot read counts as train mode (no evaluation is claimed)."""
    if not isinstance(call.func, ast.Attribute) or (name := dotted(call.func.value)) is None:
        return None
    if call.func.attr == "eval" and not call.args and not call.keywords:
        return name, True
    if call.func.attr == "train" and len(call.args) + len(call.keywords) <= 1:
        given = [*call.args, *(k.value for k in call.keywords if k.arg == "mode")]
        off = bool(given) and isinstance(given[0], ast.Constant) and given[0].value in (False, 0)
        return name, off
    return None


def _loops(index: SourceIndex, node: ast.AST, scope: ast.AST | None) -> set[int]:
    """The loops around `node` inside `scope` (None: the module), as ids."""
    out: set[int] = set()
    for n in index.ancestors(node):
        if n is scope:
            break
        if isinstance(n, LOOPS):
            out.add(id(n))
    return out


def _reaches(index: SourceIndex, backward: ast.Call, forward: ast.Call, scope: ast.AST | None) -> bool:
    """A backward can run through `forward`'s graph: every loop around it also runs the forward (no
    training loop of its own), and it comes after the forward or a loop repeats both (a GAN's step
    through a discriminator kept in eval mode, losses gathered in a loop and backpropagated after it)."""
    around = _loops(index, backward, scope)
    if not around <= _loops(index, forward, scope):
        return False
    return bool(around) or ((backward.end_lineno or 0, backward.end_col_offset or 0)
                            > (forward.end_lineno or 0, forward.end_col_offset or 0))


def _eval_forwards(index: SourceIndex, scope: ast.AST | None, body: list[ast.stmt],
                   entry: Collection[str]) -> list[tuple[ast.Call, bool]]:
    """The calls of a model in eval mode at that line, with autograd on and no backward that can run
    through them, in one function's body (or the module's), each with whether it entered so: in eval
    mode where the last `.eval()` / `.train(False)` / `.train()` of that name before the call put it so,
    or, with none, where it entered the function so (`entry`: parameters a caller passed in eval mode)."""
    calls = [n for n in walk_scope(body) if isinstance(n, ast.Call)]
    modes = _modes(calls)
    backwards = [c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr in BACKWARD]
    out = []
    for c in calls:
        if (name := dotted(c.func)) is None or not _eval_at(modes, name, c, name in entry):
            continue
        if (_under_no_grad(index, c, scope) or not index.module_ran(c)
                or any(_reaches(index, b, c, scope) for b in backwards)):
            continue
        out.append((c, _eval_at(modes, name, c, None) is None))
    return out


def _function(index: SourceIndex, facts: Facts, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
    entry = _entered_in_eval(index, facts, fn)
    forwards = _eval_forwards(index, fn, fn.body, entry)
    if not forwards or _judged_by_run(index, facts, fn.lineno, fn.end_lineno or fn.lineno):
        return
    callers = index.calls_named(fn.name)
    if not callers or any(_under_no_grad(index, c, None) for c in callers):
        return
    for c, entered in forwards:
        evaluations, shared = entry.get(dotted(c.func) or "", ([], False))
        # a helper the training step calls too: the evaluation's call of it is where no_grad goes
        for at in (evaluations if entered and shared else [c]):
            _flag(index, facts, at)


def _module(index: SourceIndex, facts: Facts) -> None:
    """The script's own top level: `model.eval()` after the training loop, then a test loop."""
    for c, _ in _eval_forwards(index, None, index.tree.body, ()):
        if not _judged_by_run(index, facts, *_lines(index, c)):
            _flag(index, facts, c)


def _lines(index: SourceIndex, node: ast.expr) -> tuple[int, int]:
    """The lines of the function around `node`, or of its top-level statement."""
    scope: ast.stmt | ast.expr | None = index.context(node)[0]
    if scope is None:
        scope = next(s for s in index.tree.body if s.lineno <= node.lineno <= (s.end_lineno or s.lineno))
    return scope.lineno, scope.end_lineno or scope.lineno


def _entered_in_eval(index: SourceIndex, facts: Facts,
                     fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, tuple[list[ast.Call], bool]]:
    """`fn`'s parameters a call of it in this file passes a model in eval mode (`model.eval();
    test(model, loader)` for `def test(net, loader)`), judged in the caller's own body: the calls that
    do, and whether another call passes a model in train mode (a helper training shares). A call in an
    evaluation the run reached and judged (`_judged_by_run`) is the run's."""
    if index.context(fn)[0] is not None or any(isinstance(p, ast.ClassDef) for p in index.ancestors(fn)):
        return {}
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    evaluations: dict[str, list[ast.Call]] = {}
    trained: set[str] = set()
    for call in index.calls_named(fn.name):
        scope = index.context(call)[0]
        if not (isinstance(call.func, ast.Name) and call.func.id == fn.name) or isinstance(scope, ast.Lambda):
            continue
        modes = _modes([n for n in walk_scope(index.tree.body if scope is None else scope.body)
                        if isinstance(n, ast.Call)])
        for param in params:
            if (arg := argument(call, fn, param, bound=False)) is None or (name := dotted(arg)) is None:
                continue
            if not _eval_at(modes, name, call, False):
                trained.add(param)
            elif not _judged_by_run(index, facts, *_lines(index, call)):
                evaluations.setdefault(param, []).append(call)
    return {p: (calls, p in trained) for p, calls in evaluations.items()}


def _modes(calls: list[ast.Call]) -> list[tuple[tuple[int, int], str, bool]]:
    """Where each `.eval()` / `.train(...)` of these calls is, of which name, and whether it is eval."""
    return sorted(((c.lineno, c.col_offset), *m) for c in calls if (m := _mode_call(c)) is not None)


def _eval_at(modes: list[tuple[tuple[int, int], str, bool]], name: str, at: ast.Call,
             entry: bool | None) -> bool | None:
    """The last of `modes` for `name` before `at` puts it in eval mode; with none, `entry` decides."""
    before = [on for pos, n, on in modes if n == name and pos < (at.lineno, at.col_offset)]
    return before[-1] if before else entry
