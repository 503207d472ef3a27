"""The shared source index: one user file read and parsed once, for every detector.

`read(path)` decodes the file (PEP 263 encoding) and parses it; `SourceIndex` then walks the tree
once and keeps what the detectors ask of it: every node (parents before children) and its parent,
the enclosing function and loop of each node, the file's import aliases (`qual` turns `nn.DataParallel`
into `torch.nn.DataParallel`), simple `name = value` assignments, the source text of a node, and
the device/dtype reading of an expression. It also makes and locates the subjects the detectors
report, with the contract's key `"<absolute file>:<line>"`.

The rule fixes (`perfdoctor/rules/fixes.py`) build the same index over the file they rewrite, so a
fix reads names, devices and dtypes exactly as the finding did.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from perfdoctor.contracts.source import read_source
from perfdoctor.facts.model import Facts, Subject
from perfdoctor.model import Location

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
# receivers of a `.step()` that takes an optimizer step: `optimizer`, `optimizer_G`, `opt`, `self.optim`,
# `scaler` (GradScaler.step steps the optimizer); not `scheduler.step()`
_OPTIMIZER_NAME = re.compile(r"optim|(^|[._])opt($|[_A-Z0-9])|scaler", re.I)
_CUDA_AVAILABLE = frozenset({"torch.cuda.is_available", "torch.accelerator.is_available",
                             "torch.backends.mps.is_available", "torch.xpu.is_available"})
LIGHTNING_TRAINERS = frozenset({"lightning.Trainer", "lightning.pytorch.Trainer", "lightning.pytorch.trainer.Trainer",
                                "pytorch_lightning.Trainer", "pytorch_lightning.trainer.Trainer"})
ACCELERATORS = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
# Lightning's Trainer, Fabric and LightningCLI (which builds a Trainer): their accelerator defaults to "auto"
LIGHTNING = LIGHTNING_TRAINERS | {"lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric",
                                  "lightning.pytorch.cli.LightningCLI", "pytorch_lightning.cli.LightningCLI"}
_PICKS_GPU = frozenset({"auto", "gpu", "cuda"})
LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
Scope = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda  # the enclosing function of a node
Located = ast.stmt | ast.expr  # a node with a position in the source
_DETAIL = "static read of the source"
UNKNOWN: Any = object()  # `SourceIndex.on_cuda`: the source does not say
# how deep the readings of a value (`device_expr`, `is_dtype`, `on_cuda`) follow names through their
# assignments, branches and calls: bounded, so that cycles (`device = torch.device(device)`) and deep
# expressions end, and memoised per name and depth (`SourceIndex._by_name`), so that fan-out stays linear
FOLLOW_DEPTH = 6


def read(path: Path) -> SourceIndex | None:
    """The index of one file, or None when it cannot be read (`contracts.source`: regular files only,
    capped; the run folder names these files), decoded or parsed."""
    sf = read_source(path)
    tree = sf.parse(str(path)) if sf is not None and sf.encoding is not None else None
    if sf is None or tree is None:
        return None
    return SourceIndex(path.resolve(), sf.lines, tree)


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def root_name(node: ast.AST) -> str | None:
    """The name at the root of `x`, `x[0]`, `x.a`, `x.float()`, `x["k"].to(d)` receivers."""
    while True:
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value
        else:
            return node.id if isinstance(node, ast.Name) else None


def walk_scope(nodes: Sequence[ast.AST]) -> Iterator[ast.AST]:
    """All nodes under `nodes`, not entering nested functions, lambdas or classes."""
    stack = list(reversed(nodes))
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (*_SCOPES, ast.ClassDef)):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(n))))


def kwarg(call: ast.Call, name: str) -> ast.expr | None:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def has_star_kwargs(call: ast.Call) -> bool:
    return any(k.arg is None for k in call.keywords)


def put(s: Subject, name: str, value: Any, unit: str = "") -> None:
    """Add a static fact unless another source already set it."""
    full = name if name.startswith(s.kind + ".") else f"{s.kind}.{name}"
    if full not in s.facts:
        s.add(full, value, unit=unit, source="static", detail=_DETAIL)


def add_union(facts: Facts, name: str, found: bool, yes: str, no: str) -> None:
    """A global bool fact that is the union over the files, one file's read at a time: this file
    raises an earlier file's static False to True; a True, or a value from another source, stays."""
    prior = facts.get(name)
    if prior is not None and (prior.source != "static" or prior.value):
        return
    if prior is None or found:
        facts.add(name, found, source="static", detail=yes if found else no)


class SourceIndex:
    """One parsed file: its nodes, parents, import aliases, loop context and source text."""

    def __init__(self, file: Path, lines: list[str], tree: ast.Module):
        self.file = str(file)
        self.lines = lines
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        # node -> (enclosing function or None, directly in a for/while body of that function)
        self.ctx: dict[ast.AST, tuple[Scope | None, bool]] = {tree: (None, False)}
        # node -> the statement (or lambda) it is part of: loops and ifs are statements, so the walks up
        # to them (`enclosing_loop`, `periodic`) start there, not at each level of a deep expression
        self._anchor: dict[ast.AST, ast.AST] = {tree: tree}
        stack: list[ast.AST] = [tree]
        self.nodes: list[ast.AST] = []  # every node, parents before children
        while stack:
            node = stack.pop()
            self.nodes.append(node)
            scope, in_loop = self.ctx[node]
            if isinstance(node, _SCOPES):
                scope, in_loop = node, False
            body = {id(b) for b in node.body} if isinstance(node, LOOPS) else ()
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
                self.ctx[child] = (scope, in_loop or id(child) in body)
                self._anchor[child] = child if isinstance(child, (ast.stmt, ast.Lambda)) else self._anchor[node]
                stack.append(child)
        self._by_type: dict[type, list[ast.AST]] = {}  # `nodes_of`
        for node in self.nodes:
            self._by_type.setdefault(type(node), []).append(node)
        self.calls: list[ast.Call] = self.nodes_of(ast.Call)
        self.aliases = self._aliases()
        # simple `name = value` assignments, for telling devices from dtypes
        self.assigned: dict[str, list[ast.expr]] = {}
        for node in self.nodes:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.assigned.setdefault(t.id, []).append(node.value)
        self.called_in_loop = set(self._calls_in_loops())
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        for node in self.nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, []).append(node)
        self._step_fns, self._epoch_fns = self._training_functions()
        self._batch_step_fns = self._step_fns - self._epoch_fns  # one step per call
        self._trains: dict[int, bool] = {}
        self._direct: dict[int, bool] = {}  # `_steps_directly` by the loop or function's id
        self._callers: dict[str, list[ast.Call]] | None = None  # function name -> its calls in this file
        self._memo: dict[tuple[str, str, int], Any] = {}  # `_by_name`
        self._framework_cpu: bool | None = None  # `gives_framework_the_cpu`
        self._named: dict[str, list[ast.Call]] | None = None  # `calls_named`
        self._epoch_loops: dict[int, bool] = {}  # `per_step`: a loop whose inner loop or callee trains
        # the qualnames of this file's classes that were part of the models a run called, where a
        # run says (set by `static.analyse_files`); None: unknown
        self.ran_classes: set[str] | None = None

    def nodes_of(self, *types: type) -> list[Any]:
        """The nodes of these exact AST types, parents before children within a type: what a detector
        asks of every loader or call looks at these, not at every node of a long file again."""
        if len(types) == 1:
            return list(self._by_type.get(types[0], []))
        return [n for n in self.nodes if type(n) in types]

    def gives_framework_the_cpu(self) -> bool:
        """Some call of this file gives a training framework the CPU (`framework_picks_gpu` False)."""
        if self._framework_cpu is None:
            self._framework_cpu = any(self.framework_picks_gpu(c) is False for c in self.calls)
        return self._framework_cpu

    def model_ran(self, node: ast.AST) -> bool:
        """False where `node` is inside a class of this file that the run's models did not hold
        (a model the script defines or imports but never called); True inside one they held,
        outside any class, or where no run says which classes ran."""
        if self.ran_classes is None:
            return True
        cls = next((p for p in self.ancestors(node) if isinstance(p, ast.ClassDef)), None)
        if cls is None:
            return True
        names = [cls.name]  # its __qualname__: "Outer.Inner", "make.<locals>.Net"
        for p in self.ancestors(cls):
            if isinstance(p, ast.ClassDef):
                names.append(p.name)
            elif isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names += ["<locals>", p.name]
        return ".".join(reversed(names)) in self.ran_classes

    def framework_picks_gpu(self, call: ast.Call) -> bool | None:
        """For a training framework's construction, whether it runs on a GPU where there is one: a
        Lightning Trainer / Fabric / LightningCLI left on accelerator "auto" (the default) or told
        "gpu" / "cuda", a Hugging Face Accelerate `Accelerator` not told `cpu=True` (a `cpu=args.cpu`
        flag is an opt-in: the script's own path is the GPU); None for any other call."""
        q = self.qual(call.func)
        if q in LIGHTNING:
            acc = kwarg(call, "accelerator")
            return acc is None or isinstance(acc, ast.Constant) and acc.value in _PICKS_GPU
        if q in ACCELERATORS:
            cpu = kwarg(call, "cpu")
            return not (isinstance(cpu, ast.Constant) and cpu.value is True)
        return None

    def bound_calls(self, node: ast.AST) -> list[ast.Call]:
        """The calls `node` stands for: itself where it is a call, else the calls this file assigns
        to its dotted name (`trainer = L.Trainer(...)`, `self.accelerator = Accelerator(...)`)."""
        if isinstance(node, ast.Call):
            return [node]
        name = dotted(node)
        return [] if name is None else [
            n.value for n in self.nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and any(dotted(t) == name for t in n.targets)]

    def _made_by(self, node: ast.AST, makers: frozenset[str], usual_name: str) -> list[ast.Call] | None:
        """The calls of `makers` that `node` stands for (`bound_calls`); None where the file binds it
        to nothing and its name is the usual one for such an object (a parameter `accelerator`,
        LightningCLI's `cli.trainer`); [] where it is something else."""
        calls = self.bound_calls(node)
        made = [c for c in calls if self.qual(c.func) in makers]
        if made or calls:
            return made
        return None if (dotted(node) or "").rsplit(".", 1)[-1] == usual_name else []

    def lightning_trainer(self, node: ast.AST) -> bool:
        """`node` is a Lightning Trainer: a `Trainer(...)` call or a name bound to one, or a
        `trainer` the file does not bind (LightningCLI's `cli.trainer`)."""
        return self._made_by(node, LIGHTNING_TRAINERS, "trainer") != []

    def accelerator_places(self, node: ast.AST) -> bool:
        """`node` is a Hugging Face Accelerate `Accelerator` that places batches on its device: an
        `Accelerator(...)` call or a name bound to one, without `device_placement=False`, or an
        `accelerator` the file does not bind (a function's parameter)."""
        made = self._made_by(node, ACCELERATORS, "accelerator")
        return made is None or any(
            not (isinstance(v := kwarg(c, "device_placement"), ast.Constant) and v.value is False) for c in made)

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        """The nodes around `node`, innermost first, up to the module."""
        p = self.parents.get(node)
        while p is not None:
            yield p
            p = self.parents.get(p)

    # -- names and context ---------------------------------------------------------------
    def _aliases(self) -> dict[str, str]:
        aliases: dict[str, str] = {}
        for node in self.nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        aliases[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    if a.name != "*":
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        return aliases

    def qual(self, node: ast.AST) -> str | None:
        """The fully qualified name of a Name/Attribute chain through the file's imports."""
        name = dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        if head not in self.aliases:
            return None
        return self.aliases[head] + ("." + rest if rest else "")

    def context(self, node: ast.AST) -> tuple[Scope | None, bool]:
        """(enclosing function or None, directly inside a for/while body of that function)."""
        return self.ctx.get(node, (None, False))

    def in_loop(self, node: ast.AST) -> bool:
        """In a loop body, or in a function of this file that a loop body calls (one level)."""
        scope, direct = self.context(node)
        return direct or (isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef))
                          and scope.name in self.called_in_loop)

    def _calls_in_loops(self) -> Iterator[str]:
        for node in self.calls:
            if self.context(node)[1]:
                f = node.func
                if isinstance(f, ast.Name):
                    yield f.id
                elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in ("self", "cls"):
                    yield f.attr

    # -- the training step ---------------------------------------------------------------
    def local_callee(self, call: ast.Call) -> str | None:
        """The name of the function of this file that `call` may call: `f(...)`, `self.f(...)`."""
        f = call.func
        if isinstance(f, ast.Name):
            name = f.id
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in ("self", "cls"):
            name = f.attr
        else:
            return None
        return name if name in self.functions else None

    def _training_functions(self) -> tuple[set[str], set[str]]:
        """(step functions: their body takes a training step, directly or through a function of
        this file; epoch functions: a loop of theirs does, `def train(epoch): for batch in loader: ...`)."""
        step: set[str] = set()
        epoch: set[str] = set()
        # each function's own calls, and each of its loops' calls, walked once (not once per pass)
        calls = {id(fn): [n for n in walk_scope(fn.body) if isinstance(n, ast.Call)]
                 for defs in self.functions.values() for fn in defs}
        loops = {id(fn): [[m for m in walk_scope(loop.body) if isinstance(m, ast.Call)]
                          for loop in walk_scope(fn.body) if isinstance(loop, LOOPS)]
                 for defs in self.functions.values() for fn in defs}
        for _ in range(4):  # calls through up to four local functions
            for name, defs in self.functions.items():
                for fn in defs:
                    if name not in step and any(self._takes_step(n, step) for n in calls[id(fn)]):
                        step.add(name)
                    if name not in epoch and (
                            any(any(self._takes_step(m, step) for m in body) for body in loops[id(fn)])
                            or any(self.local_callee(n) in epoch for n in calls[id(fn)])):
                        epoch.add(name)
        return step, epoch

    def _takes_step(self, node: ast.AST, step_fns: set[str]) -> bool:
        """`loss.backward()`, `optimizer.step()`, `torch.autograd.backward(...)`, or a call of a step function."""
        if not isinstance(node, ast.Call):
            return False
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "backward":
            return True
        if isinstance(f, ast.Attribute) and f.attr == "step" and _OPTIMIZER_NAME.search(dotted(f.value) or ""):
            return True
        return self.local_callee(node) in step_fns

    def takes_step(self, node: ast.AST) -> bool:
        """`node` is a call that takes a training step: backward, an optimizer step, a step function."""
        return self._takes_step(node, self._step_fns)

    def trains(self, loop: ast.AST) -> bool:
        """Whether `loop`'s body takes a training step (backward or an optimizer step), directly or
        through a function of this file: a training loop or an epoch loop around one."""
        key = id(loop)
        if key not in self._trains:
            self._trains[key] = any(
                self._takes_step(n, self._step_fns)
                or (isinstance(n, ast.Call) and self.local_callee(n) in self._epoch_fns)
                for n in walk_scope(loop.body))  # type: ignore[attr-defined]
        return self._trains[key]

    def has_training_loop(self) -> bool:
        """Some loop of this file takes training steps."""
        return any(isinstance(n, LOOPS) and self.trains(n) for n in self.nodes)

    def _steps_directly(self, owner: ast.AST) -> bool:
        """The body of `owner` (a loop or a function), outside its inner loops, takes a training
        step: backward, an optimizer step, or a call of a step function that is not an epoch
        function (one whose own loop takes the steps)."""
        key = id(owner)
        if key not in self._direct:
            found = False
            stack: list[ast.AST] = list(owner.body)  # type: ignore[attr-defined]
            while stack and not found:
                n = stack.pop()
                found = isinstance(n, ast.Call) and (self._takes_step(n, set())
                                                     or self.local_callee(n) in self._batch_step_fns)
                if not isinstance(n, (*LOOPS, *_SCOPES, ast.ClassDef)):
                    stack.extend(ast.iter_child_nodes(n))
            self._direct[key] = found
        return self._direct[key]

    def callers(self, name: str) -> list[ast.Call]:
        """The calls in this file that may call its function `name` (`local_callee`), in source order."""
        if self._callers is None:
            self._callers = {}
            for c in self.calls:
                callee = self.local_callee(c)
                if callee is not None:
                    self._callers.setdefault(callee, []).append(c)
        return self._callers.get(name, [])

    def calls_named(self, name: str) -> list[ast.Call]:
        """The calls `name(...)` and `<anything>.name(...)`: every call that may reach a function
        `name`, methods of other objects included (wider than `callers`)."""
        if self._named is None:
            self._named = {}
            for c in self.calls:
                if isinstance(c.func, (ast.Name, ast.Attribute)):
                    self._named.setdefault(c.func.id if isinstance(c.func, ast.Name) else c.func.attr, []).append(c)
        return list(self._named.get(name, []))

    def in_training_step(self, node: ast.AST, depth: int = 0) -> bool | None:
        """Whether `node` runs inside a training step. True when a loop around it takes the step
        in its own body (not an epoch loop, whose inner loop takes them), when its function takes
        one outside its loops (`def train_step(batch): ... loss.backward()`), or when a call of its
        function does (three levels). False when none does and the source shows every place it
        runs from: an evaluation loop, an epoch loop's own body, module code around the training
        loop. None when it cannot tell: a function no code of this file calls, a `forward` the
        model's call runs, a lambda, calls more than three levels deep."""
        child, parent = node, self.parents.get(node)
        while parent is not None and not isinstance(parent, (*_SCOPES, ast.ClassDef)):
            # the body, and a `for`'s iterator or a `while`'s test (a generator it draws batches
            # from runs between the steps); not the `else:` after the loop
            if isinstance(parent, LOOPS) and child not in parent.orelse and self._steps_directly(parent):
                return True
            child, parent = parent, self.parents.get(parent)
        scope = self.context(node)[0]
        if scope is None:
            return False
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) or scope.name in ("forward", "__call__"):
            return None
        if self._steps_directly(scope):
            return True
        sites = self.callers(scope.name)
        if not sites or depth >= 3:
            return None
        seen = [self.in_training_step(c, depth + 1) for c in sites]
        return True if True in seen else (None if None in seen else False)

    def enclosing_loop(self, node: ast.AST) -> ast.AST | None:
        """The innermost for/while loop around `node` within its function (its body, not its iterator)."""
        child = self._anchor.get(node, node)
        if child is not node and isinstance(child, ast.Lambda):
            return None  # inside a lambda: its own scope
        parent = self.parents.get(child)
        while parent is not None and not isinstance(parent, (*_SCOPES, ast.ClassDef)):
            if isinstance(parent, LOOPS) and child in parent.body:
                return parent
            child, parent = parent, self.parents.get(parent)
        return None

    def periodic(self, node: ast.AST, top: ast.AST | None = None) -> bool:
        """Behind an `if` (up to `top`, else up to its function) whose test has a `%` and whose body
        takes no training step: runs every N steps, not every step (`if i % n_critic == 0:` around
        the generator's step schedules steps: what it holds runs on each of them)."""
        child = self._anchor.get(node, node)
        if child is not node and (isinstance(child, ast.Lambda) or top is not None and not isinstance(top, ast.stmt)):
            child = node  # inside a lambda, or up to an expression: step by step
        parent = self.parents.get(child)
        while parent is not None and parent is not top and not isinstance(parent, (*_SCOPES, ast.ClassDef)):
            if isinstance(parent, ast.If) and child is not parent.test and any(
                    isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mod) for m in ast.walk(parent.test)) and not any(
                    self.takes_step(m) for m in walk_scope(parent.body)):
                return True
            child, parent = parent, self.parents.get(parent)
        return False

    def per_step(self, node: ast.AST, depth: int = 0) -> bool:
        """Whether `node` runs on every training step: in a loop's body that no inner loop takes the
        steps of (a loop whose inner loop trains is an epoch loop: once per epoch), in a module's
        `forward`, or in a function of this file called from such a place (three levels). Module
        level outside loops, an epoch loop's own body and functions no such place calls run once
        per epoch or once per run; so does what sits behind a periodic guard (`periodic`)."""
        if self.periodic(node):
            return False
        loop = self.enclosing_loop(node)
        if loop is not None:
            key = id(loop)
            if key not in self._epoch_loops:  # once per loop: a long loop body is walked once, not per node
                self._epoch_loops[key] = any(
                    (isinstance(n, LOOPS) and self.trains(n))
                    or (isinstance(n, ast.Call) and self.local_callee(n) in self._epoch_fns)
                    for n in walk_scope(loop.body))  # type: ignore[attr-defined]
            return not self._epoch_loops[key]
        scope = self.context(node)[0]
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        if scope.name in ("forward", "__call__"):
            return True
        if depth >= 3:
            return False
        return any(self.per_step(c, depth + 1) for c in self.callers(scope.name))

    def function_name(self, node: ast.AST) -> str:
        scope, _ = self.context(node)
        if scope is None:
            return "<module>"
        return "<lambda>" if isinstance(scope, ast.Lambda) else scope.name

    def text(self, node: Located) -> str:
        """The node's source text on one line (whitespace runs collapsed)."""
        end_line, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
        if end_line is None or end_col is None or end_line > len(self.lines):
            return ""
        rows = [r.encode() for r in self.lines[node.lineno - 1:end_line]]
        if len(rows) == 1:
            rows[0] = rows[0][node.col_offset:end_col]
        else:
            rows[0], rows[-1] = rows[0][node.col_offset:], rows[-1][:end_col]
        return " ".join(b"\n".join(rows).decode(errors="replace").split())

    # -- subjects ------------------------------------------------------------------------
    def subject(self, facts: Facts, kind: str, node: Located) -> Subject:
        """The subject of `kind` keyed on `node`'s line (merged with the run's and the trace's
        subject of that line), located there."""
        s = facts.subject(kind, f"{self.file}:{node.lineno}")
        self.locate(s, node)
        return s

    def locate(self, s: Subject, node: Located) -> None:
        """Add `node`'s line to the subject's locations, once."""
        line = node.lineno
        if not any(loc.file == self.file and loc.line == line for loc in s.locations):
            code = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
            s.locations.append(Location(self.file, line, code, self.function_name(node)))

    # -- devices and dtypes --------------------------------------------------------------
    def _by_name(self, what: str, name: str, depth: int, of_values: Callable[[list[ast.expr]], Any],
                 unsure: Any = None) -> Any:
        """`of_values(the values assigned to name)`, once per (question, name, depth): a name followed
        through its assignments (`device = torch.device(device)`, `a = b; b = a`) costs each question
        at most names x FOLLOW_DEPTH evaluations, whatever the file's cycles and fan-out. While it is
        being worked out, the name reads as `unsure`."""
        key = (what, name, depth)
        if key not in self._memo:
            self._memo[key] = unsure
            self._memo[key] = of_values(self.assigned.get(name, []))
        return self._memo[key]

    def is_dtype(self, node: ast.AST, depth: int = 0) -> bool:
        q = self.qual(node)
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
            if self.qual(node.func) == "torch.device":
                return self.device_expr(node.args[0], depth + 1) if node.args else None
            return None
        name = dotted(node)
        if name is None or self.is_dtype(node):
            return None
        if isinstance(node, ast.Name) and node.id in self.assigned:
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
            q = self.qual(node.func)
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
        if isinstance(node, ast.Name) and node.id in self.assigned:
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
        q = self.qual(node)
        if q and q.startswith("torch.cuda.") and q.endswith("Tensor"):
            return q[len("torch.cuda."):]
        if isinstance(node, ast.IfExp):
            test = self.on_cuda(node.test)
            if test is UNKNOWN:
                return None
            return self.cuda_tensor_type(node.body if test else node.orelse, depth + 1)
        if isinstance(node, ast.Name) and len(self.assigned.get(node.id, [])) == 1:
            return self.cuda_tensor_type(self.assigned[node.id][0], depth + 1)
        return None

    def move_target(self, call: ast.Call) -> str | None:
        """For `recv.cuda(...)` / `recv.to(...)`: the device's source text when it moves to a
        (possibly CUDA) device; None for dtype-only casts, CPU targets and anything unsure."""
        f = call.func
        if not isinstance(f, ast.Attribute):
            return None
        if f.attr == "cuda":
            dev = call.args[0] if call.args else kwarg(call, "device")
            return "cuda" if dev is None else self.text(dev)
        if f.attr != "to":
            return None
        dev = kwarg(call, "device")
        if dev is None and call.args:
            dev = call.args[0]
        if dev is None or self.device_expr(dev) is not True:
            return None
        return self.text(dev)
