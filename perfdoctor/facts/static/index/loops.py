"""Loops and steps: where a file's training step is, and how often a node runs.

Which of the file's functions take a training step (`loss.backward()`, an optimizer's `.step()`, a
call of such a function, through up to four local functions) and which hold a loop that does (an
epoch function); whether a loop trains (`trains`), whether a node runs inside a training step
(`in_training_step`), on every step (`per_step`: not once per epoch, not behind a periodic `if i %
n == 0:` guard), on every pass of the step with nothing to pass it by (`every_step`: PD020's line), in a
loop (`in_loop`, `enclosing_loop`). Reads the file through `Syntax`, and the
project's other files through their `Loops` (`peers`, set by `static.analyse_files`): a function whose
calls are all in another file (`ddpm.sample(...)` after each epoch, in the training script, of a method
defined in the model's file) is judged where it is called.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from perfdoctor.facts.static.index.settings import option_default
from perfdoctor.facts.static.index.syntax import LOOPS, SCOPES, Syntax, dotted, walk_scope

# receivers of a `.step()` that takes an optimizer step: `optimizer`, `optimizer_G`, `opt`, `self.optim`,
# `scaler` (GradScaler.step steps the optimizer); not `scheduler.step()`
_OPTIMIZER_NAME = re.compile(r"optim|(^|[._])opt($|[_A-Z0-9])|scaler", re.I)


class Loops:
    """The training loops and steps of one file."""

    def __init__(self, syntax: Syntax):
        self.syntax = syntax
        # the line of this file's call, in the training loop, that the run saw lead to its first optimizer
        # step (`static.outer_calls`, `set_step_calls`): a call there takes a step, whatever the source says
        # of its callee (a module whose forward steps its optimizer: MAML's `maml(x_spt, ...)`)
        self.step_calls: frozenset[int] = frozenset()
        self._into_step: set[int] = set()  # ids of the outermost calls at those lines
        self.called_in_loop = set(self._calls_in_loops())  # names of the functions a loop body calls
        self._step_fns, self._epoch_fns = self._training_functions()
        self._batch_step_fns = self._step_fns - self._epoch_fns  # one step per call
        self._trains: dict[int, bool] = {}
        self._direct: dict[int, bool] = {}  # `_steps_directly` by the loop or function's id
        self._epoch_loops: dict[int, bool] = {}  # `per_step`: a loop whose inner loop or callee trains
        self._env_steps: list[ast.Call] | None = None
        # the `Loops` of the project's other files (set by `static.analyse_files`; empty: this file alone)
        self.peers: list[Loops] = []
        # lines of this file's calls that the run saw lead into the training loop from outside it
        # (`static.outer_calls`): a loop around one runs once per training run, not per step
        self.outer_lines: frozenset[int] = frozenset()

    @property
    def env_steps(self) -> list[ast.Call]:
        """The calls that step an environment, by the gym API's shape: a `.step(...)` whose result is
        unpacked into four or more names (`obs, reward, terminated, truncated, info = envs.step(a)`; an
        optimizer's or a scheduler's step returns at most a loss). Reinforcement learning's rollout:
        the algorithm's own work, run on the host."""
        if self._env_steps is None:
            self._env_steps = [
                n.value for n in self.syntax.nodes if isinstance(n, ast.Assign) and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Tuple) and len(n.targets[0].elts) >= 4
                and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute)
                and n.value.func.attr == "step"]
        return self._env_steps

    def in_rollout(self, node: ast.AST) -> bool:
        """In the loop that steps an environment (`env_steps`: the innermost loop around the step, not an
        outer loop that also updates and saves), a statement holding such a step, or a call of a
        function of this file that steps one (`collect_rollout()`)."""
        steps = self.env_steps
        if not steps:
            return False
        inner = next((p for p in (node, *self.syntax.ancestors(node)) if isinstance(p, LOOPS)), None)
        for step in steps:
            up = list(self.syntax.ancestors(step))
            if any(a is node for a in up):
                return True  # a statement holding the step (the rollout loop's own line)
            if inner is not None and next((a for a in up if isinstance(a, LOOPS)), None) is inner:
                return True  # in the loop that steps: not an outer loop around rollout and update
        stepping = {name for s in steps if (name := self.syntax.function_name(s)) and name != "<module>"}
        return any(isinstance(c, ast.Call) and self.syntax.local_callee(c) in stepping for c in ast.walk(node))

    def in_loop(self, node: ast.AST) -> bool:
        """In a loop body, or in a function of this file that a loop body calls (one level)."""
        scope, direct = self.syntax.context(node)
        return direct or (isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef))
                          and scope.name in self.called_in_loop)

    def _calls_in_loops(self) -> Iterator[str]:
        for node in self.syntax.calls:
            if self.syntax.context(node)[1]:
                f = node.func
                if isinstance(f, ast.Name):
                    yield f.id
                elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in ("self", "cls"):
                    yield f.attr

    def _training_functions(self) -> tuple[set[str], set[str]]:
        """(step functions: their body takes a training step, directly or through a function of
        this file; epoch functions: a loop of theirs does, `def train(epoch): for batch in loader: ...`)."""
        step: set[str] = set()
        epoch: set[str] = set()
        # each function's own calls, and each of its loops' calls, walked once (not once per pass)
        calls = {id(fn): [n for n in walk_scope(fn.body) if isinstance(n, ast.Call)]
                 for defs in self.syntax.functions.values() for fn in defs}
        loops = {id(fn): [[m for m in walk_scope(loop.body) if isinstance(m, ast.Call)]
                          for loop in walk_scope(fn.body) if isinstance(loop, LOOPS)]
                 for defs in self.syntax.functions.values() for fn in defs}
        for _ in range(4):  # calls through up to four local functions
            for name, defs in self.syntax.functions.items():
                for fn in defs:
                    if name not in step and any(self._takes_step(n, step) for n in calls[id(fn)]):
                        step.add(name)
                    if name not in epoch and (
                            any(any(self._takes_step(m, step) for m in body) for body in loops[id(fn)])
                            or any(self.syntax.local_callee(n) in epoch for n in calls[id(fn)])):
                        epoch.add(name)
        return step, epoch

    def set_step_calls(self, lines: frozenset[int]) -> None:
        """The run's call into the step (`step_calls`); what was judged without it is judged again."""
        if lines == self.step_calls:
            return
        self.step_calls = lines
        # the outermost call there: `train(*random_training_set(...))` steps through train, not the batch
        # function whose result it is given
        at = [c for c in self.syntax.calls if any(c.lineno <= line <= (c.end_lineno or c.lineno) for line in lines)]
        self._into_step = {id(c) for c in at if not any(
            isinstance(p, ast.Call) and any(p is q for q in at) for p in self.syntax.ancestors(c))}
        self._step_fns, self._epoch_fns = self._training_functions()
        self._batch_step_fns = self._step_fns - self._epoch_fns
        self._trains.clear()
        self._direct.clear()
        self._epoch_loops.clear()

    def _takes_step(self, node: ast.AST, step_fns: set[str]) -> bool:
        """`loss.backward()`, `optimizer.step()`, `torch.autograd.backward(...)`, a call of a step function,
        or the call the run saw lead to its optimizer step from the training loop (`step_calls`)."""
        if not isinstance(node, ast.Call):
            return False
        if id(node) in self._into_step:
            return True
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "backward":
            return True
        if isinstance(f, ast.Attribute) and f.attr == "step" and _OPTIMIZER_NAME.search(dotted(f.value) or ""):
            return True
        return self.syntax.local_callee(node) in step_fns

    def takes_step(self, node: ast.AST) -> bool:
        """`node` is a call that takes a training step: backward, an optimizer step, a step function."""
        return self._takes_step(node, self._step_fns)

    def training_functions(self) -> frozenset[str]:
        """The names of this file's functions that take a training step, directly or through a loop of
        theirs (step and epoch functions): what another file's loop trains through by calling them."""
        return frozenset(self._step_fns)

    def trains(self, loop: ast.AST) -> bool:
        """Whether `loop`'s body takes a training step (backward or an optimizer step), directly or
        through a function of this file: a training loop or an epoch loop around one."""
        key = id(loop)
        if key not in self._trains:
            self._trains[key] = any(
                self._takes_step(n, self._step_fns)
                or (isinstance(n, ast.Call) and self.syntax.local_callee(n) in self._epoch_fns)
                for n in walk_scope(loop.body))  # type: ignore[attr-defined]
        return self._trains[key]

    def has_training_loop(self) -> bool:
        """Some loop of this file takes training steps."""
        return any(isinstance(n, LOOPS) and self.trains(n) for n in self.syntax.nodes)

    def project_trains(self) -> bool:
        """Some loop of this file or of the project's other files takes training steps: the project
        shows where its steps are, so `in_training_step` False means a place no step runs."""
        return self.has_training_loop() or any(p.has_training_loop() for p in self.peers)

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
                                                     or self.syntax.local_callee(n) in self._batch_step_fns)
                if not isinstance(n, (*LOOPS, *SCOPES, ast.ClassDef)):
                    stack.extend(ast.iter_child_nodes(n))
            self._direct[key] = found
        return self._direct[key]

    def in_training_step(self, node: ast.AST, depth: int = 0) -> bool | None:
        """Whether `node` runs inside a training step. True when a loop around it takes the step
        in its own body (not an epoch loop, whose inner loop takes them), when its function takes
        one outside its loops (`def train_step(batch): ... loss.backward()`), or when a call of its
        function does (three levels), or when no code of this file calls it and another file's
        training step calls a function of its name once per step (`peers`: the agent's update calling
        `self.replay_buffer.sample(...)`, `def sample` in buffers.py). False when none does and the source shows every place it
        runs from: an evaluation loop, an epoch loop's own body, module code around the training
        loop, or, for a function only the project's other files call (`peers`), every such call
        there. None when it cannot tell: a function no code of the project calls, a `forward` the
        model's call runs, a lambda, calls more than three levels deep."""
        child, parent = node, self.syntax.parents.get(node)
        while parent is not None and not isinstance(parent, (*SCOPES, ast.ClassDef)):
            # the body, and a `for`'s iterator or a `while`'s test (a generator it draws batches
            # from runs between the steps); not the `else:` after the loop
            if isinstance(parent, LOOPS) and child not in parent.orelse and self._steps_directly(parent):
                return True
            child, parent = parent, self.syntax.parents.get(parent)
        scope = self.syntax.context(node)[0]
        if scope is None:
            return False
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) or scope.name in ("forward", "__call__"):
            return None
        if self._steps_directly(scope):
            return True
        sites = self.syntax.callers(scope.name)
        if not sites and isinstance(self.syntax.parents.get(scope), ast.ClassDef):
            # a method called on an object (`ddpm.sample(...)` after each epoch): every call of that
            # name in the file, another class's method of the same name included (any True wins)
            sites = self.syntax.calls_named(scope.name)
        if depth >= 3:
            return None
        if not sites:
            # called from the project's other files only: True where a training step there calls it once
            # per step (not a function of that file of the same name); False where every call of that
            # name there runs outside the steps (a model file's `sample`, called after each epoch)
            there = [(p, c) for p in self.peers for c in p.syntax.calls_named(scope.name)]
            seen = [p.in_training_step(c, depth + 1) for p, c in there]
            if any(v is True and p.syntax.local_callee(c) is None and p.once_per_step(c)
                   for v, (p, c) in zip(seen, there)):
                return True
            return False if seen and all(v is False for v in seen) else None
        seen = [self.in_training_step(c, depth + 1) for c in sites]
        return True if True in seen else (None if None in seen else False)

    def once_per_step(self, c: ast.AST) -> bool:
        """`c` runs once per training step where it runs in one: not behind a periodic guard, not once
        per update of an epoch function (a rollout's `buffer.get()` before the loop that takes the
        steps); in a loop, `per_step`."""
        if self.periodic(c):
            return False
        if self.enclosing_loop(c) is not None:
            return self.per_step(c)
        scope = self.syntax.context(c)[0]
        return isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and scope.name not in self._epoch_fns

    def enclosing_loop(self, node: ast.AST) -> ast.AST | None:
        """The innermost for/while loop around `node` within its function (its body, not its iterator)."""
        child = self.syntax.anchors.get(node, node)
        if child is not node and isinstance(child, ast.Lambda):
            return None  # inside a lambda: its own scope
        parent = self.syntax.parents.get(child)
        while parent is not None and not isinstance(parent, (*SCOPES, ast.ClassDef)):
            if isinstance(parent, LOOPS) and child in parent.body:
                return parent
            child, parent = parent, self.syntax.parents.get(parent)
        return None

    def periodic(self, node: ast.AST, top: ast.AST | None = None) -> bool:
        """Behind an `if` (up to `top`, else up to its function) whose test has a `%` and whose body
        takes no training step: runs every N steps, not every step (`if i % n_critic == 0:` around
        the generator's step schedules steps: what it holds runs on each of them)."""
        child = self.syntax.anchors.get(node, node)
        if child is not node and (isinstance(child, ast.Lambda) or top is not None and not isinstance(top, ast.stmt)):
            child = node  # inside a lambda, or up to an expression: step by step
        parent = self.syntax.parents.get(child)
        while parent is not None and parent is not top and not isinstance(parent, (*SCOPES, ast.ClassDef)):
            if isinstance(parent, ast.If) and child is not parent.test and any(
                    isinstance(m, ast.BinOp) and isinstance(m.op, ast.Mod) and not self._every_one(m.right)
                    for m in ast.walk(parent.test)) and not any(
                    self.takes_step(m) for m in walk_scope(parent.body)):
                return True
            child, parent = parent, self.syntax.parents.get(parent)
        return False

    def _every_one(self, n: ast.expr) -> bool:
        """A guard's modulus that is 1 unless the user changes it: `i % 1`, `i % args.log_interval` with
        the option's default 1 (charcnn's logging on every batch). A value the run's command line gives
        is the corpus's or the user's choice for that run, not the script's; a plain name is left a
        setting (nanoGPT's `log_interval = 1`, which its configurator's config file sets to 10)."""
        if isinstance(n, ast.Constant):
            return n.value == 1
        if isinstance(n, ast.Attribute):
            return option_default(self.syntax, n.attr) == 1
        return False

    def per_step(self, node: ast.AST, depth: int = 0) -> bool:
        """Whether `node` runs on every training step: in a loop's body that no inner loop takes the
        steps of (a loop whose inner loop trains is an epoch loop: once per epoch), in a module's
        `forward`, or in a function of this file called from such a place (three levels), or, where
        no code of this file calls it, once per training step by the project's other files (`peers`). Module
        level outside loops, an epoch loop's own body and functions no such place calls run once
        per epoch or once per run; so does what sits behind a periodic guard (`periodic`), and a loop
        around a call the run saw lead into the training loop from outside it (`outer_lines`)."""
        if self.periodic(node):
            return False
        loop = self.enclosing_loop(node)
        if loop is not None:
            key = id(loop)
            if key not in self._epoch_loops:  # once per loop: a long loop body is walked once, not per node
                self._epoch_loops[key] = any(
                    (isinstance(n, LOOPS) and self.trains(n))
                    or (isinstance(n, ast.Call) and (self.syntax.local_callee(n) in self._epoch_fns
                                                     or n.lineno in self.outer_lines))
                    for n in walk_scope(loop.body))  # type: ignore[attr-defined]
            return not self._epoch_loops[key]
        scope = self.syntax.context(node)[0]
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        if scope.name in ("forward", "__call__"):
            return True
        if depth >= 3:
            return False
        sites = self.syntax.callers(scope.name)
        if sites:
            return any(self.per_step(c, depth + 1) for c in sites)
        # called from the project's other files only (`peers`: a CRF's loss in a model file, which the
        # model's loss method in another calls, which the training loop calls): where such a call runs
        # on every step there and inside a training step (not an evaluation loop, nor behind a periodic
        # guard; not a function of that file of the same name)
        return any(p.syntax.local_callee(c) is None and p.per_step(c, depth + 1)
                   and p.in_training_step(c, depth + 1) is True
                   for p in self.peers for c in p.syntax.calls_named(scope.name))

    def every_step(self, node: ast.AST) -> bool:
        """Whether `node` (a statement) runs on every training step: the header of a loop that takes the
        steps (its iterator is drawn once a step), or `per_step` and `in_training_step` with nothing between it and its
        enclosing loop (or its function) that can pass it by: no `if` or `match` branch, `try` handler
        or `else`, loop `else`, nor a `continue`, `break`, `return` or `raise` before it in a body around
        it. A periodic stall is at a line that does not (PD020): a line on every step that some steps
        take longer in is no work to run less often."""
        if isinstance(node, LOOPS) and self._steps_directly(node):
            return True
        if not self.per_step(node) or self.in_training_step(node) is not True:
            return False  # a loop the source shows no training step in: nothing to say each pass is a step
        loop = self.enclosing_loop(node)
        child = self.syntax.anchors.get(node, node)
        parent = self.syntax.parents.get(child)
        while parent is not None and parent is not loop and not isinstance(parent, (*SCOPES, ast.ClassDef)):
            if isinstance(parent, ast.If) and child is not parent.test:
                return False
            if isinstance(parent, (ast.ExceptHandler, ast.match_case)) or child in getattr(parent, "orelse", ()):
                return False  # a handler, a case, a loop's or a try's `else:`
            if _exits_before(parent, child):
                return False
            child, parent = parent, self.syntax.parents.get(parent)
        return parent is None or not _exits_before(parent, child)


def _exits_before(parent: ast.AST, child: ast.AST) -> bool:
    """A statement before `child` in the body of `parent` that holds there a `continue` or `break` (not
    inside an inner loop), a `return` or a `raise`: the rest of the body may not run."""
    for name in ("body", "finalbody"):
        stmts = getattr(parent, name, None)
        if not isinstance(stmts, list) or child not in stmts:
            continue
        for before in stmts[:stmts.index(child)]:
            stack: list[ast.AST] = [before]
            while stack:
                n = stack.pop()
                if isinstance(n, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
                    return True
                if not isinstance(n, (*LOOPS, *SCOPES, ast.ClassDef)):
                    stack.extend(ast.iter_child_nodes(n))
                elif isinstance(n, LOOPS):  # a return or raise in an inner loop's body still leaves
                    stack.extend(m for m in walk_scope(n.body + n.orelse) if isinstance(m, (ast.Return, ast.Raise)))
    return False
