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
- a read of a value already on the host (`_Host`): the result of `.cpu()`, `.numpy()`, `.tolist()`,
  `.item()` or a numpy function, what a method chain, arithmetic, a comparison or indexing makes of
  one, and a name the function binds only to such values (`preds = out.argmax(1).cpu()` then
  `(preds == y_cpu).sum().item()`; `arr = t.detach().cpu().numpy()` then `arr.tolist()`). The sync
  was the `.cpu()`, counted once at its line (`t.detach().cpu().item()` is one read of kind "cpu");
  the probe, on a CPU run where every tensor is on the host, counts the later read too;
- an action read for an environment (`actions = q.argmax(1).cpu().numpy()` then
  `obs, reward, term, trunc, info = envs.step(actions)`, or returned by an action-selection function
  of this file: `action = self.select_action(obs)`): the environment runs on the host, the action
  must cross whatever the script does (`_env_actions`);
- in a loop that no training step runs, in a file whose loops show where the steps are
  (`Loops.in_training_step` False): an evaluation loop and a function it calls (the probe
  counts an evaluation between epochs as reads per training step too), an epoch loop's own body
  (once per epoch). An inner loop of the training loop (`for p in model.parameters():
  p.grad.norm().item()`) reads on every step.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.syntax import LOOPS, called_name, dotted, walk_scope

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
    on_host: dict[int, tuple[ast.expr, list[str]]] = {}  # line -> reads of values already on the host
    hosts = _Host(index)
    training_loops: list[ast.AST] = [loop for loop in index.nodes if isinstance(loop, LOOPS)
                                     and _is_training(index, loop, training_fns)]
    for loop in training_loops:
        _reads(index, loop.body, loop, reads, hosts, on_host)  # type: ignore[attr-defined]
        host |= _host_batch_reads(index, loop)
    for fn in index.nodes:  # a step function with its own backward, called from a loop
        if (isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in training_fns
                and fn.name in index.loops.called_in_loop):
            _reads(index, fn.body, fn, reads, hosts, on_host)
    # elsewhere (a metric helper the step calls): the probe counts these lines too; a line that also
    # reads a value not known to be on the host is left to the run
    elsewhere: dict[int, tuple[ast.expr, list[str]]] = {}
    device_lines: set[int] = set()
    for n in index.calls:
        f = n.func
        if isinstance(f, ast.Attribute) and f.attr in _METHODS and not n.args and not n.keywords:
            what, read = f.attr, f.value
        elif isinstance(f, ast.Name) and f.id in _CASTS and len(n.args) == 1 and not n.keywords:
            what, read = f.id, n.args[0]
        else:
            continue
        if not hosts.on_host(read):
            device_lines.add(n.lineno)
        elif n.lineno not in reads and n.lineno not in on_host:
            elsewhere.setdefault(n.lineno, (n, []))[1].append(what)
    on_host.update((line, v) for line, v in elsewhere.items() if line not in device_lines)
    # reads in a loop that no training step runs, where the file shows where its steps are: an
    # evaluation loop (the run's probe counts its reads too, per training step, when it runs
    # between epochs)
    outside: list[tuple[ast.expr, str]] = [
        (n, kind) for n in index.nodes if isinstance(n, ast.expr) and (kind := _any_read(n)) is not None
        and index.loops.in_loop(n) and index.loops.in_training_step(n) is False] if index.loops.has_training_loop() else []
    to_env = _env_actions(index)
    not_per_step = host | {n.lineno for n, _ in outside} | to_env
    for line, (read, kinds) in reads.items():
        s = index.subject(facts, "host_read", read)
        put(s, "kind", ", ".join(sorted(kinds, key=_ORDER.index)))
        put(s, "in_loop", line not in not_per_step)
    rare: dict[int, tuple[ast.expr, list[str]]] = {}
    host_only = [(n, k) for n, kinds in on_host.values() for k in kinds]  # no device tensor read on the line
    env_reads = [(n, k) for n in index.nodes
                 if isinstance(n, ast.expr) and n.lineno in to_env and (k := _any_read(n)) is not None]
    for read, kind in [*_less_than_every_step(index, training_loops), *outside, *host_only, *env_reads]:
        if read.lineno not in reads:
            kinds = rare.setdefault(read.lineno, (read, []))[1]
            if kind not in kinds:
                kinds.append(kind)
    for read, kinds in rare.values():
        s = index.subject(facts, "host_read", read)
        put(s, "kind", ", ".join(sorted(kinds, key=_ORDER.index)))
        put(s, "in_loop", False)


def _env_actions(index: SourceIndex) -> set[int]:
    """Lines that read an action for an environment: the read is given to, or bound to a name the same
    function gives to, an environment's step (`Loops.env_steps`, the gym API), or returned by a function
    of this file whose result is (`action = self.select_action(obs)`, `return a.detach().cpu().numpy()`,
    one name deep inside it), whichever of the project's files steps the environment (`Loops.peers`:
    utils.py's `action = agent.get_action(state)` then `env.step(action)`, the agent's `get_action` in
    dqn.py). The environment runs on the host: the action must cross whatever the script does."""
    lines: set[int] = set()
    for loops in [index.loops, *index.loops.peers]:
        here = loops is index.loops
        syntax = index if here else loops.syntax
        for call in loops.env_steps:
            given = [*call.args, *(k.value for k in call.keywords)]
            names = {x.id for a in given for x in ast.walk(a) if isinstance(x, ast.Name)}
            if here:
                lines |= {x.lineno for a in given for x in ast.walk(a)
                          if isinstance(x, ast.expr) and _any_read(x) is not None}
            helpers = {c for a in given for c in ast.walk(a) if isinstance(c, ast.Call)}
            fn = syntax.function_name(call)
            for n in syntax.nodes_of(ast.Assign):
                if syntax.function_name(n) == fn and any(isinstance(t, ast.Name) and t.id in names for t in n.targets):
                    if here and any(_any_read(x) is not None for x in ast.walk(n.value)):
                        lines.add(n.lineno)
                    helpers |= {c for c in ast.walk(n.value) if isinstance(c, ast.Call)}
            for c in helpers:
                # this file's function the call reaches: by this file's own resolution, or by the name
                # it is called by (`agent.get_action` in another file, `onlineQNetwork.select_action`
                # of a model object in this one)
                callee = (index.local_callee(c) if here else None) or called_name(c)
                for helper in index.functions.get(callee, []) if callee else []:
                    lines |= _returned_reads(helper)
    return lines


def _returned_reads(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[int]:
    """Lines of `fn` that read what it returns: a read in a `return`, or one bound to a name a
    `return` gives back (`action = ...cpu().numpy()` then `return np.clip(action, ...)`)."""
    returns = [n.value for n in walk_scope(fn.body) if isinstance(n, ast.Return) and n.value is not None]
    lines = {x.lineno for r in returns for x in ast.walk(r) if isinstance(x, ast.expr) and _any_read(x) is not None}
    names = {x.id for r in returns for x in ast.walk(r) if isinstance(x, ast.Name)}
    for n in walk_scope(fn.body):
        if (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in n.targets)
                and any(_any_read(x) is not None for x in ast.walk(n.value))):
            lines.add(n.lineno)
    return lines


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


def _reads(index: SourceIndex, body: list[ast.stmt], top: ast.AST, reads: dict[int, tuple[ast.expr, list[str]]],
           hosts: _Host, on_host: dict[int, tuple[ast.expr, list[str]]]) -> None:
    """The reads of `body` on every step into `reads`; those of a value already on the host into
    `on_host` (no sync of their own)."""
    tensors = _tensor_names(body)
    for n in walk_scope(body):
        if not isinstance(n, ast.Call):
            continue
        kind = None
        f = n.func
        shown: list[ast.expr] = []  # what the call reads
        if isinstance(f, ast.Attribute) and f.attr in _METHODS and not n.args and not n.keywords:
            kind, shown = f.attr, [f.value]
        elif isinstance(f, ast.Name) and f.id in _CASTS and len(n.args) == 1 and not n.keywords:
            kind, shown = f.id, [n.args[0]]
        elif isinstance(f, ast.Name) and f.id == "print":
            kind = "print"
            shown = [a for a in [*n.args, *(v.value for a in n.args if isinstance(a, ast.JoinedStr)
                                            for v in a.values if isinstance(v, ast.FormattedValue))]
                     if isinstance(a, ast.Name) and a.id in tensors]
        if kind is None or not shown or index.loops.periodic(n, top):
            continue
        if all(hosts.on_host(a) for a in shown):
            into = on_host
        elif kind in _CASTS and not (isinstance(shown[0], ast.Name) and shown[0].id in tensors):
            continue  # `float(args.lr)`: no tensor the step makes
        else:
            into = reads
        first, kinds = into.setdefault(n.lineno, (n, []))
        if kind not in kinds:
            kinds.append(kind)
    for line in set(on_host) & set(reads):  # the line reads a device tensor too: that is its one sync
        del on_host[line]


class _Host:
    """Which expressions are values already on the host: an array (the result of `.cpu()` or
    `.numpy()`, of a numpy function), a Python number (`.item()`, `.tolist()`, a literal) or a tensor
    the script made on the host (`made`: a torch constructor given no device, `torch.LongTensor(lens)`,
    `torch.tensor(ids)`, `torch.zeros(b, t)`); what a method chain (not `.to()` / `.cuda()`), indexing,
    or arithmetic and comparisons with a host array make of one (a CUDA operand beside a host array
    fails on the GPU) or of numbers and made tensors only; an element of iterating one (`for n in
    lengths`, through `zip` and `enumerate`); and a name its function (or the module) binds only to
    such values before the read (a binding after it counts where a loop around both brings it back
    round: `lens = torch.LongTensor(...)`, `lens.max().item()`, then `lens = lens.cuda()` reads a host
    tensor; the same three lines in a loop body read the moved one on the next pass)."""

    _ARRAY = frozenset({"cpu", "numpy"})
    _NUMBER = frozenset({"item", "tolist"})
    _TO_DEVICE = frozenset({"to", "cuda", "type_as"})
    # torch's constructors of a new CPU tensor, from host data or sizes, unless given device= (the
    # legacy types take none); `*_like` keep their input's device and are left out
    _MADE = frozenset({"tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "empty", "arange", "linspace",
                       "eye", "randn", "rand", "randint", "randperm", "normal", "FloatTensor", "DoubleTensor",
                       "HalfTensor", "ByteTensor", "CharTensor", "ShortTensor", "IntTensor", "LongTensor",
                       "BoolTensor", "Tensor"})

    def __init__(self, index: SourceIndex):
        self.index = index
        # (scope, line) -> the names bound only to host values before that line
        self.names: dict[tuple[ast.AST | None, int], dict[str, str]] = {}

    def on_host(self, expr: ast.expr) -> bool:
        scope, _ = self.index.context(expr)
        key = (scope, expr.lineno)
        names = self.names.get(key)
        if names is None:
            names = self.names[key] = self._host_names(scope, expr)
        return self._kind(expr, names) is not None

    def _kind(self, n: ast.expr, names: dict[str, str]) -> str | None:
        """"array", "number" or "made" for a host value, None for a device tensor or one not known."""
        while True:
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                q = self.index.qual(n.func)
                if q is not None:  # a module's function: numpy's work on the host, torch's a new tensor
                    if q.startswith("numpy."):
                        return "array"
                    made = q.startswith("torch.") and q[6:] in self._MADE and not any(
                        k.arg in ("device", None) for k in n.keywords)
                    return "made" if made else None
                if n.func.attr in self._ARRAY and not n.keywords:
                    return "array"
                if n.func.attr in self._NUMBER and not n.args and not n.keywords:
                    return "number"
                if n.func.attr in self._TO_DEVICE:
                    return None
                n = n.func.value
            elif isinstance(n, (ast.Attribute, ast.Subscript)):
                n = n.value
            elif isinstance(n, ast.UnaryOp):
                n = n.operand
            elif isinstance(n, (ast.BinOp, ast.Compare)):
                parts = [n.left, n.right] if isinstance(n, ast.BinOp) else [n.left, *n.comparators]
                kinds = [self._kind(x, names) for x in parts]
                if "array" in kinds:
                    return "array"
                if all(k == "number" for k in kinds):
                    return "number"
                # a made tensor with numbers or made tensors: still on the host (beside a tensor not
                # known, the result is where that one is)
                return "made" if all(k in ("number", "made") for k in kinds) else None
            elif isinstance(n, ast.Name):
                return names.get(n.id)
            else:
                return "number" if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) else None

    def _element(self, it: ast.expr, names: dict[str, str]) -> str | None:
        """The kind of what iterating `it` gives: a number for `range(...)`, a made tensor's rows or
        items (`for n in lengths`), an array's."""
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range":
            return "number"
        kind = self._kind(it, names)
        return kind if kind in ("made", "array") else None

    def _for_targets(self, target: ast.expr, it: ast.expr, bind: Any) -> bool:
        """Bind the names of a `for` target to what iterating `it` gives (`bind((name, value))`),
        through `enumerate(...)` and `zip(...)`; False where the target's shape is not followed."""
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and not it.keywords:
            if (it.func.id == "enumerate" and len(it.args) == 1 and isinstance(target, ast.Tuple)
                    and len(target.elts) == 2 and isinstance(target.elts[0], ast.Name)):
                bind((target.elts[0], ast.Constant(0)))
                return self._for_targets(target.elts[1], it.args[0], bind)
            if (it.func.id == "zip" and isinstance(target, ast.Tuple) and len(target.elts) == len(it.args)
                    and it.args):
                return all(self._for_targets(t, a, bind) for t, a in zip(target.elts, it.args))
        if isinstance(target, ast.Name):
            bind((target, _Element(it)))
            return True
        return False

    def _host_names(self, scope: ast.AST | None, read: ast.expr) -> dict[str, str]:
        """The names `scope` binds only with `name = <host value>` (or `name += <host value>`, or as a
        `for` target over host values) before `read`, each "array", "number" or "made"."""
        body = scope.body if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else (
            [] if scope is not None else self.index.tree.body)
        values: dict[str, list[ast.expr | _Element]] = {}
        other: set[str] = set()  # bound otherwise: a parameter, a tuple, `with ... as`, a target not followed
        followed: set[int] = set()  # id() of the for-target names bound through _for_targets
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = scope.args
            other |= {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x is not None}
        around = self._loops(read)

        def before(n: ast.AST) -> bool:  # bound before the read, or brought round to it by a loop
            return n.lineno < read.lineno or bool(self._loops(n) & around)  # type: ignore[attr-defined]

        def bind(name: ast.Name, value: ast.expr | _Element) -> None:
            followed.add(id(name))
            values.setdefault(name.id, []).append(value)

        for n in walk_scope(body):
            if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and n.value is not None:
                if not before(n):
                    continue
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        values.setdefault(t.id, []).append(n.value)
                    else:
                        other |= {m.id for m in ast.walk(t) if isinstance(m, ast.Name) and isinstance(m.ctx, ast.Store)}
            elif isinstance(n, (ast.For, ast.AsyncFor)) and before(n):
                local: list[tuple[ast.Name, ast.expr | _Element]] = []
                if self._for_targets(n.target, n.iter, local.append):
                    for name, v in local:
                        bind(name, v)
        for n in walk_scope(body):
            if (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and id(n) not in followed
                    and not isinstance(self.index.parents.get(n), (ast.Assign, ast.AnnAssign, ast.AugAssign))
                    and before(self._statement(n))):
                other.add(n.id)
        names: dict[str, str] = {}
        for _ in range(4):  # names bound to other host names
            grown: dict[str, str] = {}
            for k, vs in values.items():
                kinds = [self._element(v.it, names) if isinstance(v, _Element) else self._kind(v, names) for v in vs]
                if k not in other and None not in kinds:
                    grown[k] = "array" if "array" in kinds else "made" if "made" in kinds else "number"
            if grown == names:
                break
            names = grown
        return names

    def _statement(self, n: ast.AST) -> ast.AST:
        """The statement that holds `n`."""
        while not isinstance(n, ast.stmt):
            parent = self.index.parents.get(n)
            if parent is None:
                return n
            n = parent
        return n

    def _loops(self, n: ast.AST) -> set[int]:
        """id() of the for/while loops of its function around `n`."""
        out: set[int] = set()
        loop = self.index.loops.enclosing_loop(n)
        while loop is not None:
            out.add(id(loop))
            loop = self.index.loops.enclosing_loop(loop)
        return out


class _Element:
    """What a `for` loop binds its target to: an item of iterating `it`."""

    __slots__ = ("it",)

    def __init__(self, it: ast.expr):
        self.it = it
