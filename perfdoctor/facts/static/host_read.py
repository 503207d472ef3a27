"""Host reads of device tensors in the training step (PD008): `.item()`, `.cpu()`, `.numpy()`,
`.tolist()`, `float(t)` / `int(t)` and `print(t)` of a tensor, each a host-device sync on a GPU.

One `host_read` subject per line, with `host_read.kind` (the kinds on that line, e.g. "item" or
"cpu, numpy") and `host_read.in_loop`. Only reads that run on every step count (`in_loop` True): in a
training loop (a loop whose body, or a function of this file it calls, runs `.backward()`), or in a
function that runs `.backward()` and is called from a loop. A tensor for `float()`, `int()` and
`print()` is a name the step calls `.backward()` on or a loss-like name bound in the loop (`loss`,
`d_loss`).

`in_loop` False marks the lines the source shows read less often than every step, or read no device
tensor at all; the run's probe counts reads at those lines too (and, with a short logging interval
for a short run, may count one per step), so the rule trusts the source there:
- behind a periodic guard (`if i % log_every == 0:`) that takes no training step of its own (a guard
  that does, `if i % n_critic == 0: ... opt_G.step()`, schedules steps: its reads are per step);
- in a function of this file that only such guarded code calls (`progress.display(i)` every
  print_freq steps), and in `__str__` / `__repr__` / `__format__` where no training loop formats
  anything on every step (the meters a periodic display prints);
- `.numpy()` / `.tolist()` / `.cpu()` of a batch tensor from a DataLoader that the step never moves to the
  device (labels turned one-hot on the host): a host tensor on a GPU run too;
- in a loop that no training step runs, in a file whose loops show where the steps are
  (`Loops.in_training_step` False): an evaluation loop and a function it calls (the probe
  counts an evaluation between epochs as reads per training step too), an epoch loop's own body
  (once per epoch). An inner loop of the training loop (`for p in model.parameters():
  p.grad.norm().item()`) reads on every step.
"""

from __future__ import annotations

import ast
import re

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.syntax import LOOPS, dotted, walk_scope

_METHODS = ("item", "cpu", "numpy", "tolist")
_CASTS = ("float", "int")
_ORDER = (*_METHODS, *_CASTS, "print")
_FORMATTERS = ("__str__", "__repr__", "__format__")
_LOADER_NAME = re.compile(r"loader|^data$|dataloader", re.I)
_LOSS_NAME = re.compile(r"(^|_)loss(es)?($|_)|^(err|error)(_|$)", re.I)


def detect(index: SourceIndex, facts: Facts) -> None:
    # step functions: a backward outside any loop of theirs (`def train_step(...)`); a function whose
    # backward is inside its own loop (`def train(epoch)`) is the step loop itself, and a loop that
    # calls it is an epoch loop
    training_fns = {fn.name for fn in index.nodes if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and _runs_backward(fn.body, loops=False)}
    reads: dict[int, tuple[ast.expr, list[str]]] = {}  # line -> (first read node, kinds)
    host: set[int] = set()  # lines reading a batch tensor the step never moves to the device
    training_loops: list[ast.AST] = [loop for loop in index.nodes if isinstance(loop, LOOPS)
                                     and _is_training(index, loop, training_fns)]
    for loop in training_loops:
        _reads(index, loop.body, loop, reads)  # type: ignore[attr-defined]
        host |= _host_batch_reads(index, loop)
    for fn in index.nodes:  # a step function with its own backward, called from a loop
        if (isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in training_fns
                and fn.name in index.loops.called_in_loop):
            _reads(index, fn.body, fn, reads)
    # reads in a loop that no training step runs, where the file shows where its steps are: an
    # evaluation loop (the run's probe counts its reads too, per training step, when it runs
    # between epochs)
    outside: list[tuple[ast.expr, str]] = [
        (n, kind) for n in index.nodes if isinstance(n, ast.expr) and (kind := _any_read(n)) is not None
        and index.loops.in_loop(n) and index.loops.in_training_step(n) is False] if index.loops.has_training_loop() else []
    not_per_step = host | {n.lineno for n, _ in outside}
    for line, (read, kinds) in reads.items():
        s = index.subject(facts, "host_read", read)
        put(s, "kind", ", ".join(sorted(kinds, key=_ORDER.index)))
        put(s, "in_loop", line not in not_per_step)
    rare: dict[int, tuple[ast.expr, list[str]]] = {}
    for read, kind in [*_less_than_every_step(index, training_loops), *outside]:
        if read.lineno not in reads:
            kinds = rare.setdefault(read.lineno, (read, []))[1]
            if kind not in kinds:
                kinds.append(kind)
    for read, kinds in rare.values():
        s = index.subject(facts, "host_read", read)
        put(s, "kind", ", ".join(sorted(kinds, key=_ORDER.index)))
        put(s, "in_loop", False)


def _less_than_every_step(index: SourceIndex, training_loops: list[ast.AST]) -> list[tuple[ast.expr, str]]:
    """(read, kind) for the reads behind a periodic guard, in the functions only such code calls,
    and in the formatting dunders where no training loop formats on every step."""
    periodic_fns: set[str] = set()
    for _ in range(4):  # functions called only from guarded code or from other such functions
        for name in index.functions:
            sites = index.calls_named(name)
            if name not in periodic_fns and sites and all(
                    index.loops.periodic(c, None) or index.function_name(c) in periodic_fns for c in sites):
                periodic_fns.add(name)
    formats_every_step = any(
        _formats(n) and not index.loops.periodic(n, loop)
        for loop in training_loops for n in walk_scope(loop.body))  # type: ignore[attr-defined]
    out: list[tuple[ast.expr, str]] = []
    for n in index.nodes:
        kind = _any_read(n)
        if kind is None:
            continue
        fn = index.function_name(n)
        if (index.loops.periodic(n, None) or fn in periodic_fns
                or (fn in _FORMATTERS and not formats_every_step)):
            out.append((n, kind))  # type: ignore[arg-type]
    return out


def _any_read(n: ast.AST) -> str | None:
    """The kind of a call that may read a tensor on the host: a read method, a cast, a print or a
    format (`str.format`, `str()`, an f-string)."""
    if isinstance(n, ast.JoinedStr):
        return "print"
    if not isinstance(n, ast.Call):
        return None
    f = n.func
    if isinstance(f, ast.Attribute) and f.attr in _METHODS and not n.args and not n.keywords:
        return f.attr
    if isinstance(f, ast.Attribute) and f.attr == "format":
        return "print"
    if isinstance(f, ast.Name) and f.id in (*_CASTS, "print", "str"):
        return "print" if f.id == "str" else f.id
    return None


def _formats(n: ast.AST) -> bool:
    """Turns an object into text: print, str(), str.format, an f-string, `%`-formatting of a string."""
    if isinstance(n, ast.JoinedStr):
        return any(isinstance(v, ast.FormattedValue) for v in n.values)
    if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and isinstance(n.left, ast.Constant):
        return isinstance(n.left.value, str)
    return isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Name) and n.func.id in ("print", "str", "repr", "format"))
        or (isinstance(n.func, ast.Attribute) and n.func.attr == "format"))


def _host_batch_reads(index: SourceIndex, loop: ast.AST) -> set[int]:
    """Lines of `loop` that read (`.numpy()`, `.tolist()`, `.cpu()`) one of its batch names
    (`for i, (imgs, labels) in enumerate(loader)`) before any statement moves or rebinds it."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not isinstance(loop.iter, (ast.Name, ast.Attribute, ast.Call)):
        return set()
    if not _over_loader(index, loop.iter):
        return set()
    batch = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    rebound: dict[str, int] = {}  # name -> first line that rebinds it
    for n in walk_scope(loop.body):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                for m in ast.walk(t):
                    if isinstance(m, ast.Name) and m.id in batch:
                        rebound[m.id] = min(rebound.get(m.id, n.lineno), n.lineno)
    lines: set[int] = set()
    for n in walk_scope(loop.body):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("numpy", "tolist", "cpu")
                and isinstance(n.func.value, ast.Name) and n.func.value.id in batch
                and n.lineno <= rebound.get(n.func.value.id, n.lineno)):
            lines.add(n.lineno)
    return lines


def _over_loader(index: SourceIndex, it: ast.expr) -> bool:
    """`loader`, `enumerate(loader)`, `tqdm(loader)`: a name that looks like a DataLoader."""
    if isinstance(it, ast.Call) and it.args:
        it = it.args[0]
    name = dotted(it) or ""
    return bool(_LOADER_NAME.search(name.rsplit(".", 1)[-1]))


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
        if kind is None or index.loops.periodic(n, top):
            continue
        first, kinds = reads.setdefault(n.lineno, (n, []))
        if kind not in kinds:
            kinds.append(kind)
