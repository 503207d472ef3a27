"""A plain Python batch source on the training thread (PD002): no DataLoader, the training loop draws
its batches from a generator of the user's (`for batch in dataset.batches(): ...`,
`batch = next(train_gen)`) or from an object of a user class whose `__iter__` is a generator or
whose `__next__` makes the batch (`for batch in SentPairDataLoader(...)`). Every step waits while it
reads, tokenises and fills tensors; a DataLoader with workers over the same code (an IterableDataset)
would make the next batches while the model computes.

Decided from what the run observed, tied to the source by the static read:
- the source: a function of the user's files that is a generator (a `yield` in its own body) or a
  `__next__` method, that cProfile saw called at least `MIN_CALLS_PER_STEP` times per profiled step
  (a generator's every resume is a call, its cumulative time is the batch making the step waited
  for), that turns host data into tensors (a torch call in it or in the functions of its file it
  calls, or the run's factory lines there: the factory probe leaves out `torch.tensor(data)`): the
  step's input is host data turned into tensors, not a rollout that steps an environment (`Loops.in_rollout`: the
  algorithm's own work, which a DataLoader cannot take over);
- the draw: a `for` loop whose own body takes the training step (not an epoch loop) over the source,
  or a `next(source)` in such a step; what the loop iterates is followed to the call that made it
  (through `enumerate` / `iter` / `tqdm`, assignments, and the arguments a function's or a class's
  callers pass for its parameter, across the user's files): a call of the generator function, or a
  construction of the class. A draw the run saw take a DataLoader's batches (`loader_draws`), or a
  source that draws them itself, is that loader's wait, measured by the DataLoader probe already.

The subject is a `dataloader` at the call that made the source (the draw and the source's own
function are further locations) with `num_workers` 0, `source` (what it is, for PD002's message),
`trains`, and the wait: the source's cumulative time's share of the profiled steps' wall time
(`wait_fraction`; cProfile slows Python code, so its milliseconds are not a steady step's) times
the median steady step (`wait_ms`), and, on a CPU run, the GPU projection PD002 reads
(`facts.run.dataloader.project_to_gpu`).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Sequence
from functools import partial

from perfdoctor.facts.model import Facts
from perfdoctor.facts.run.dataloader import project_to_gpu
from perfdoctor.facts.run.hotspots import FunctionShare
from perfdoctor.facts.static.dataloader import DATALOADER
from perfdoctor.facts.static.index import SourceIndex
from perfdoctor.facts.static.index.syntax import argument, dotted, walk_scope

# a source resumed on about every step (a generator drawn once per step over a few profiled steps)
MIN_CALLS_PER_STEP = 0.5
# a function called once per step: over 3 profiled steps a step boundary inside a call makes 4/3
MAX_CALLS_PER_STEP = 1.5
# the calls a loop's iterable passes through to the source (`enumerate(tqdm(source))`)
_PASS_THROUGH = frozenset({"enumerate", "iter", "tqdm"})
_DEPTH = 4  # assignments and parameters followed

Function = ast.FunctionDef | ast.AsyncFunctionDef


def add_sources(indexes: Sequence[SourceIndex], facts: Facts,
                shares: dict[str, dict[int, FunctionShare]],
                loader_draws: dict[str, list[tuple[str, int]]],
                model_calls: Sequence[tuple[str, int]] = ()) -> None:
    """`shares`: per file (its real path), per function's first line, (cumulative time over the
    profiled steps' wall time, calls per profiled step); `loader_draws`: the DataLoaders' draw lines;
    `model_calls`: the (file, line) where the run saw the script call its models."""
    draws = {(os.path.realpath(f), line) for sites in loader_draws.values() for f, line in sites}
    sources = [x for index in indexes for x in _sources(index, shares, draws)]
    done: set[tuple[str, int]] = set()
    for index in indexes if sources else []:
        for draw, expr in _draw_points(index):
            if (os.path.realpath(index.file), draw.lineno) in draws or _iterates_dataloader(index, expr):
                continue
            for made_in, call in _made_by(indexes, index, expr, 0) or []:
                name = _callee(call)
                for src_index, fn, cls, share in sources:
                    if name is None or name != (cls if fn.name in ("__iter__", "__next__") else fn.name):
                        continue
                    key = (str(made_in.file), call.lineno)
                    if key not in done:
                        done.add(key)
                        kind = "a generator" if fn.name != "__next__" else "an iterator's __next__"
                        _subject(facts, made_in, call, index, draw, src_index, fn, cls, share,
                                 f"{kind} of the script's on the training thread")
    _called_sources(indexes, facts, shares, draws, model_calls, done)


def _called_sources(indexes: Sequence[SourceIndex], facts: Facts, shares: dict[str, dict[int, FunctionShare]],
                    draws: set[tuple[str, int]], model_calls: Sequence[tuple[str, int]],
                    done: set[tuple[str, int]]) -> None:
    """No loop iterable makes the batch: a loop that counts the steps (`for i in range(n)`, a
    `while`) and takes the training step in its own body (not an evaluation loop in a function the
    training loop calls every N steps: nanoGPT's `estimate_loss`) calls a function of the user's once per step whose result the model's call then takes
    (NGCF's `users, pos, neg = data_generator.sample()`, then `model(users, pos, neg)`), or hands its
    result straight to a function of the user's that calls the model (char-rnn's
    `train(*random_training_set(n, b))`; `_step_inputs`). The model's call is the run's (the forward
    probe's call site of a top-level model, in the same loop body after it, or in that function); the function is one cProfile saw called about once per profiled step (not a
    generator: those are the draws above), that calls no model itself (the run's model calls are not
    in it: a frozen encoder's features are compute) and takes no training step. Not in a loop that
    draws a DataLoader's batches anywhere in its body (its batch is the loader's, a function on it a
    transform), nor one taking what a helper of the user's that draws them returned
    (`_takes_a_loaders_batch`), nor in a project that steps an environment (a replay buffer's sample is the
    reinforcement-learning algorithm's own work)."""
    if any(index.loops.env_steps for index in indexes):
        return
    models = {(os.path.realpath(f), line) for f, line in model_calls}
    sourced: set[tuple[str, int]] = set()
    for index in indexes:
        real = os.path.realpath(index.file)
        loops = index.loops
        for call, loop, feeds in _step_inputs(indexes, index, models):
            name = _callee(call)
            if name is not None and loop is None:
                loop = _stepping_loop(index, call)
            if name is None or loop is None or not _counts_steps(indexes, index, loop):
                continue
            end = loop.end_lineno or loop.lineno  # type: ignore[attr-defined]
            if any(f == real and loop.lineno <= line <= end for f, line in draws):  # type: ignore[attr-defined]
                continue
            if _takes_a_loaders_batch(indexes, index, call, loop, draws):
                continue
            if not loops.trains(loop) or not loops.per_step(call) or loops.takes_step(call) or not feeds():
                continue
            # each of its call sites in this file at most once per step (`tensorized(sents)` and
            # `tensorized(tags)` in the step, the same two in an evaluation a short epoch runs as often):
            # a function called per sample is called a batch's times
            sites = len(index.calls_named(name))
            for other in indexes:
                other_real = os.path.realpath(other.file)
                for fn in other.functions.get(name, []):
                    first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
                    times = shares.get(other_real, {})
                    fs = times.get(first)
                    if (fs is None or not MIN_CALLS_PER_STEP <= fs.calls <= MAX_CALLS_PER_STEP * max(1, sites)
                            or fs.share <= 0 or (other_real, first) in sourced
                            or not _works_here(other, fn, fs, times)
                            or any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in walk_scope(fn.body))
                            or _holds(other_real, fn, models | draws)
                            or any(other.loops.takes_step(n) for n in walk_scope(fn.body))):
                        continue
                    key = (str(index.file), call.lineno)
                    if key not in done:
                        done.add(key)
                        sourced.add((other_real, first))  # one subject per source: its wait is one
                        parent = other.parents.get(fn)
                        _subject(facts, index, call, index, call, other, fn,
                                 parent.name if isinstance(parent, ast.ClassDef) else None, fs.share,
                                 "called once per step on the training thread, its result the model's input")


def _holds(real: str, fn: Function, sites: set[tuple[str, int]]) -> bool:
    """One of the run's (file, line) `sites` lies in `fn` of the file at `real`."""
    end = fn.end_lineno or fn.lineno
    return any(f == real and fn.lineno <= line <= end for f, line in sites)


def _takes_a_loaders_batch(indexes: Sequence[SourceIndex], index: SourceIndex, call: ast.Call, loop: ast.AST,
                           draws: set[tuple[str, int]]) -> bool:
    """The call takes a name that an earlier statement of the same loop body bound from a function of the
    user's in which the run saw a DataLoader's batches drawn (deep-text-recognition-benchmark's
    `image_tensors, labels = train_dataset.get_batch()`, whose `get_batch` calls `next()` on its loaders'
    iterators, then `converter.encode(labels)`): the batch is the loader's, drawn through a helper, and the
    call a transform of it, not a source."""
    taken = {n.id for a in [*call.args, *(k.value for k in call.keywords)] for n in ast.walk(a)
             if isinstance(n, ast.Name)}
    for stmt in index.nodes_of(ast.Assign):
        if not (stmt.lineno < call.lineno and index.loops.enclosing_loop(stmt) is loop
                and isinstance(stmt.value, ast.Call)):
            continue
        if not taken & {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}:
            continue
        name = _callee(stmt.value)
        for other in indexes:
            real = os.path.realpath(other.file)
            if name and any(_holds(real, fn, draws) for fn in other.functions.get(name, [])):
                return True
    return False


def _stepping_loop(index: SourceIndex, call: ast.Call) -> ast.AST | None:
    """For a call in a function with no loop around it, the loop of this file that calls that function
    once per pass and so takes a training step through it (ner's `train()` calls `self.train_step(...)`
    in a loop over range(); the batch is built in `train_step`): that loop's passes are the steps."""
    scope = index.context(call)[0]
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    for c in index.callers(scope.name):
        loop = index.loops.enclosing_loop(c)
        if loop is not None and (index.loops.takes_step(c) or index.loops.trains(loop)) and index.loops.per_step(c):
            return loop
    return None


def _step_inputs(indexes: Sequence[SourceIndex], index: SourceIndex, models: set[tuple[str, int]]
                 ) -> list[tuple[ast.Call, ast.AST | None, Callable[[], bool]]]:
    """The calls in a loop whose result becomes the model's input, with their loop and a check of that:
    `users, pos, neg = data_generator.sample()` then, later in the same loop body, the run's model call
    taking one of those names (NGCF); or a call handed straight to a function of the user's files that
    calls the model itself (char-rnn's `loss = train(*random_training_set(n, b))`, the model called in
    `train()`)."""
    real = os.path.realpath(index.file)
    loops = index.loops
    mine = [m for m in index.calls if (real, m.lineno) in models]
    out: list[tuple[ast.Call, ast.AST | None, Callable[[], bool]]] = []
    for stmt in index.nodes_of(ast.Assign) if mine else []:
        call, loop = stmt.value, loops.enclosing_loop(stmt)
        if not isinstance(call, ast.Call):
            continue
        results = {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        out.append((call, loop, partial(_model_takes, index, stmt, loop, results, mine)))
    for outer in index.calls:
        name = _callee(outer)
        if name is None:
            continue
        for arg in [*outer.args, *(k.value for k in outer.keywords)]:
            inner = arg.value if isinstance(arg, ast.Starred) else arg
            if isinstance(inner, ast.Call):
                out.append((inner, loops.enclosing_loop(outer), partial(_calls_a_model, indexes, name, models)))
    return sorted(out, key=lambda x: (x[0].lineno, x[0].col_offset))  # a source called twice: its first call


def _model_takes(index: SourceIndex, stmt: ast.Assign, loop: ast.AST | None, results: set[str],
                 model_calls: list[ast.Call]) -> bool:
    """A model call of the run's, later in the same loop body (in the same function where no loop is
    around `stmt`), takes one of the names `stmt` assigns."""
    scope = index.context(stmt)[0]
    return any(m.lineno > stmt.lineno and index.loops.enclosing_loop(m) is loop
               and (loop is not None or index.context(m)[0] is scope) and any(
        isinstance(n, ast.Name) and n.id in results
        for a in [*m.args, *(k.value for k in m.keywords)] for n in ast.walk(a)) for m in model_calls)


def _calls_a_model(indexes: Sequence[SourceIndex], name: str, models: set[tuple[str, int]]) -> bool:
    """A function of that name in the user's files holds a model call the run saw."""
    for other in indexes:
        real = os.path.realpath(other.file)
        if any(_holds(real, fn, models) for fn in other.functions.get(name, [])):
            return True
    return False


def _works_here(index: SourceIndex, fn: Function, fs: FunctionShare, times: dict[int, FunctionShare]) -> bool:
    """The function makes the batch on the training thread: at least half its time is Python of the
    user's (its own time and the cumulative time of the functions of its file it calls or defines,
    cProfile's), or it calls torch (tensors made from the host's data). Not a function that waits
    for a batch other processes or threads make (SASRec's `WarpSampler.next_batch()`:
    `return self.result_queue.get()`, fed by worker processes: its time is the queue's)."""
    names = {_callee(n) for n in ast.walk(fn) if isinstance(n, ast.Call)}
    inner = [d for d in ast.walk(fn) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d is not fn]
    callees = {id(d): d for d in inner + [d for name in names if name for d in index.functions.get(name, []) if d is not fn]}
    user = fs.own + sum(t.share for d in callees.values()
                        if (t := times.get(min([d.lineno, *(x.lineno for x in d.decorator_list)]))) is not None)
    return user >= fs.share / 2 or any(isinstance(n, ast.Call) and (index.qual(n.func) or "").startswith("torch.")
                                       for n in ast.walk(fn))


def _counts_steps(indexes: Sequence[SourceIndex], index: SourceIndex, loop: ast.AST) -> bool:
    """A loop whose iteration draws no batch: a `while`, or a `for` over `range(...)` (through the
    pass-through calls), or over a `zip` of such and of lists the user's functions made before the loop
    (SR-GNN's `for i, j in zip(slices, np.arange(len(slices)))` over `slices = data.generate_batch(n)`,
    index arrays: the batch is made in the step, `_made_list`)."""
    if isinstance(loop, ast.While):
        return True
    return _counting(indexes, index, getattr(loop, "iter", None))


def _counting(indexes: Sequence[SourceIndex], index: SourceIndex, it: ast.expr | None) -> bool:
    while isinstance(it, ast.Call) and _callee(it) in _PASS_THROUGH and it.args:
        it = it.args[0]
    if isinstance(it, ast.Call) and _callee(it) == "zip" and it.args:
        return all(_counting(indexes, index, a) or _made_list(indexes, index, a) for a in it.args)
    return isinstance(it, ast.Call) and _callee(it) in ("range", "trange", "arange")


def _made_list(indexes: Sequence[SourceIndex], index: SourceIndex, node: ast.expr) -> bool:
    """A name this file binds only to what functions of the user's return with no `yield` in them: a
    list made before the loop, not a generator that makes each batch as it is drawn."""
    if not isinstance(node, ast.Name):
        return False
    values = index.assigned.get(node.id, [])
    names = [_callee(v) if isinstance(v, ast.Call) else None for v in values]
    defs = [fn for name in names if name is not None for other in indexes for fn in other.functions.get(name, [])]
    return bool(values) and None not in names and bool(defs) and not any(
        isinstance(n, (ast.Yield, ast.YieldFrom)) for fn in defs for n in walk_scope(fn.body))


def _sources(index: SourceIndex, shares: dict[str, dict[int, FunctionShare]],
             draws: set[tuple[str, int]]) -> list[tuple[SourceIndex, Function, str | None, float]]:
    """This file's batch sources the run saw: (index, function, its class's name, its share)."""
    real = os.path.realpath(index.file)
    times = shares.get(real)
    if not times:
        return []
    out = []
    for defs in index.functions.values():
        for fn in defs:
            first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
            fs = times.get(first)
            if fs is None or fs.calls < MIN_CALLS_PER_STEP or fs.share <= 0:
                continue
            share = fs.share
            body = list(walk_scope(fn.body))
            if not (fn.name == "__next__" or any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in body)):
                continue
            if _holds(real, fn, draws):
                continue  # it draws a DataLoader's batches: that loader's wait
            if any(index.loops.in_rollout(stmt) for stmt in fn.body):
                continue  # it steps an environment: the algorithm's rollout, not data loading
            if not _makes_tensors(index, fn, body):
                continue
            parent = index.parents.get(fn)
            out.append((index, fn, parent.name if isinstance(parent, ast.ClassDef) else None, share))
    return out


def _makes_tensors(index: SourceIndex, fn: Function, body: list[ast.AST]) -> bool:
    """It turns host data into tensors: in `fn` or in a function of its file it calls, the run saw a
    torch factory make a host tensor (`index.factories_ran`), or a torch function is called (the
    factory probe leaves out `torch.tensor(data)`, the usual way, whose data is not a factory's)."""
    fns = [fn] + [d for n in body if isinstance(n, ast.Call) and (callee := index.local_callee(n))
                  for d in index.functions.get(callee, []) if d is not fn]
    ran = index.factories_ran or frozenset()
    return any(f.lineno <= line <= (f.end_lineno or f.lineno) for f in fns for line in ran) or any(
        isinstance(n, ast.Call) and (index.qual(n.func) or "").startswith("torch.")
        for f in fns for n in ast.walk(f))


def _draw_points(index: SourceIndex) -> list[tuple[ast.For | ast.AsyncFor | ast.Call, ast.expr]]:
    """(the draw, what it draws from): a `for` loop whose own body takes the training step, and a
    `next(x)` run once per training step."""
    loops = index.loops
    out: list[tuple[ast.For | ast.AsyncFor | ast.Call, ast.expr]] = []
    for node in index.nodes_of(ast.For, ast.AsyncFor):
        if node.body and loops.trains(node) and loops.per_step(node.body[0]):
            out.append((node, node.iter))
    for call in index.calls:
        if (isinstance(call.func, ast.Name) and call.func.id == "next" and call.args
                and loops.in_training_step(call) is True and loops.per_step(call)):
            out.append((call, call.args[0]))
    return out


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _iterates_dataloader(index: SourceIndex, expr: ast.expr) -> bool:
    """The file builds a DataLoader and binds it to the name iterated (a static read where the run
    recorded no draw)."""
    while isinstance(expr, ast.Call) and _callee(expr) in _PASS_THROUGH and expr.args:
        expr = expr.args[0]
    return any(index.qual(c.func) in DATALOADER for c in index.bound_calls(expr))


def _made_by(indexes: Sequence[SourceIndex], index: SourceIndex, expr: ast.expr, depth: int
             ) -> list[tuple[SourceIndex, ast.Call]] | None:
    """The calls that made what `expr` stands for, with their files: `expr` itself (through the
    pass-through calls), the calls assigned to its name, the values assigned to it (`self.it = it`),
    and for a parameter of its function the arguments the function's callers pass (a method's and a
    constructor's callers by name in any of the user's files); None where nothing is found."""
    while isinstance(expr, ast.Call) and _callee(expr) in _PASS_THROUGH and expr.args:
        expr = expr.args[0]
    if isinstance(expr, ast.Call):
        return [(index, expr)]
    if depth >= _DEPTH:
        return None
    name = dotted(expr)
    if name is None:
        return None
    out: list[tuple[SourceIndex, ast.Call]] = []
    for node in index.nodes_of(ast.Assign):
        for target in node.targets:
            # `x = value`, and `a, x = a_value, value`
            pairs = list(zip(target.elts, node.value.elts)) if isinstance(target, ast.Tuple) and isinstance(
                node.value, ast.Tuple) and len(target.elts) == len(node.value.elts) else [(target, node.value)]
            out += [m for t, v in pairs if dotted(t) == name and v is not expr
                    for m in _made_by(indexes, index, v, depth + 1) or []]
    if out:
        return out
    fn = next((p for p in index.ancestors(expr) if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if fn is None or not isinstance(expr, ast.Name):
        return None  # an attribute never assigned in this file, or a module-level name
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if expr.id not in params and expr.id not in [a.arg for a in fn.args.kwonlyargs]:
        return None
    cls = index.parents.get(fn)
    method = isinstance(cls, ast.ClassDef)
    called = cls.name if method and fn.name == "__init__" else fn.name  # type: ignore[union-attr]
    for other in indexes:
        for call in other.calls_named(called):
            arg = argument(call, fn, expr.id, bound=method)
            if arg is not None:
                out += _made_by(indexes, other, arg, depth + 1) or []
    return out or None


def _subject(facts: Facts, made_in: SourceIndex, call: ast.Call, index: SourceIndex, draw: ast.For | ast.AsyncFor | ast.Call,
             src_index: SourceIndex, fn: Function, cls: str | None, share: float, kind: str) -> None:
    s = made_in.subject(facts, "dataloader", call)
    index.locate(s, draw)
    src_index.locate(s, fn)
    what = (f"{cls}.{fn.name}" if cls else fn.name) + ("()" if fn.name != "__next__" else "")
    s.add("source", f"{what}, {kind}", source="static",
          detail=f"{src_index.file}:{fn.lineno}; the training loop draws from it at {index.file}:{draw.lineno}")
    first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
    s.add("source_def", f"{os.path.basename(src_index.file)}({first}): {fn.name}", source="static",
          detail="the source's frame as the profiler names it (facts/trace/target_gpu.py leaves its ops to the host)")
    s.add("num_workers", 0, "count", source="static", detail="no DataLoader: the training process makes every batch")
    s.add("trains", True, source="static", detail="a loop that takes the training step draws its batches")
    step = facts.get("step.time_ms")
    s.add("wait_fraction", share, "ratio",
          detail=f"cProfile: {what}'s cumulative time over the profiled steps' wall time")
    if step is None or not isinstance(step.value, (int, float)):
        return
    wait = share * step.value
    s.add("wait_ms", wait, "ms", detail=f"wait_fraction x the median step ({step.value:.1f} ms)")
    device = facts.get("device.type")
    project_to_gpu(facts, s, wait, step.value, device.value if device is not None else None,
                   basis=f"{what}'s share of the profiled steps (cProfile) x the median step")
