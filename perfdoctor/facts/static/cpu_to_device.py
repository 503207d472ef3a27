"""A tensor made on the CPU and then moved to a device (PD004): one `cpu_to_device` subject per
factory call, with the factory's name, the move's target as written and `in_loop` (made on every
training step: `Loops.per_step`; a tensor made once per epoch or once per run costs nothing
per step).

`torch.tensor(x)` and `torch.as_tensor(x)` count only for a literal `x`: other data is the host's (an
environment's observation, a numpy array) and must cross to the device however the tensor is made.

Three shapes: chained (`torch.randn(...).cuda()`, `torch.zeros(...).to(device)`, through views and
dtype casts: `torch.LongTensor(range(L)).expand_as(w).to(device)`; and a name its function bound before
to a tensor computed from a host factory, moved where it is read: GRAND's `masks = torch.bernoulli(1. -
drop_rates)` over `drop_rates = torch.FloatTensor(np.ones(n) * p)`, then `masks.cuda() * features`; a
legacy type given a numpy fill or draw, `NUMPY_FILLS`, is a factory: the device makes those values too),
keyed on the call;
two statements (`x = torch.randn(...)` then, a few statements later in the same block,
`x = x.to(device)`, or in the body of an `if use_cuda:` there, or `return (x.to(device), ...)`; in between
the tensor may be filled by index, `x[i] = ...` or a row's slice `x[i][:n] = ...`, which makes it the host's
data, and wrapped in `Variable`; an in-place fill, `.fill_(0)`, keeps the tensor made), keyed on the factory line
with the move line as the second location (a `torch.cat`/`torch.stack` of names bound only to factories is a
factory's tensor, keyed on the join); and host
data given to a legacy CUDA tensor type (`Tensor(np.random.normal(...))` with
`Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`: numpy fills the array on the host,
the constructor copies it to the GPU), keyed on the call. A legacy type given sizes
(`Tensor(n, 1).fill_(1.0)`) allocates on the GPU and is left alone.

Host data copied inside the training step on every step (`host_data`): `torch.tensor(x)`,
`torch.as_tensor(x)`, `torch.from_numpy(x)`, a legacy type given data (`torch.FloatTensor(batch)`) or
`torch.cat`/`torch.stack` of host tensors (not of a tensor its function already moved: `_moved_name`), moved to a device by a line that runs once per training
step inside the step (`Loops.in_training_step`; a function that takes one step per call, or the loop
that takes the steps), not in an environment's rollout unless drawn (`Loops.in_rollout`: an observation
must cross to act), and drawn from a store (`_drawn`: rows taken by an index, `torch.cat`/`torch.stack` of stored
rows; not a value as it came, a one-step actor-critic's next observation). That is a batch drawn from a
store kept in host memory (a replay buffer, a numpy rollout
sliced into minibatches), copied again on every update; a store on the device would not be. An
observation moved to act, a rollout copied once per update before its epochs, and data moved in a
loop that takes no training step stay the data's own copy. An update inline in the loop that steps the
environment copies its drawn sample all the same (`_copied_every_step`). The data is followed through a
parameter to what the file's calls pass it (`_passed`), a list filled by `append` from a draw's items, a
`for` loop's items, conversions (`.toarray()`, `.astype()`), a helper of the file whose every return is
such a copy (`_helper_copy`: `naive_sparse2tensor(rows).to(device)`), and `torch.tensor(rows,
device=device)` is the same copy (`_copied_to_device`).

Not in an `nn.Module` class that none of the models the run called holds (`SourceIndex.module_ran`:
a vendored library's model file, a model the script defines but never builds): code the run never
executed is no cost of its steps. Nor a factory call of the kinds the run's host-tensor probe watches
whose lines made no host tensor in the steps it watched (`_not_run`: a branch the configuration never
takes, SupConLoss's `torch.eye` mask for the unsupervised loss when labels are given, a loss helper
only another loss calls), nor one of another kind (a legacy type's literal) in a function the
profiled steps never called (`_never_called`: cProfile's functions; a LARS optimizer the script defines
beside the Adam it uses), unless an `if` around it within its function takes it only on the
accelerator (`if use_cuda: index = torch.randperm(n).cuda()`): a CPU run cannot take that branch, so
the source says what its GPU runs do. Nor a move the run watched never run (`_move_not_run`: no
`.to` / `.cuda` / `.type_as` at its lines in the watched steps, under the same exception), whatever
made the tensor.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from perfdoctor.capture.probes.host_tensors import FACTORIES as WATCHED
from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.devices import UNKNOWN
from perfdoctor.facts.static.index.syntax import LOOPS, argument, called_name, has_star_kwargs, kwarg, root_name, walk_scope

# torch factories that allocate on the CPU unless given `device=`. Left out on purpose:
# `from_numpy` (it has no `device=`, the data is on the host anyway) and the `*_like`
# factories (they take the device of their input, which may already be the GPU).
FACTORIES = frozenset({
    "randn", "rand", "randint", "randperm", "zeros", "ones", "full", "empty", "empty_strided",
    "arange", "linspace", "logspace", "eye", "tensor", "as_tensor", "normal",
})
# the factories that copy data given to them: `torch.tensor(reward).to(device)` moves what the host
# computed (an environment step, numpy), which no device-side factory can make; only a literal's copy
# is avoidable (made on the device, or once outside the loop)
DATA_FACTORIES = frozenset({"tensor", "as_tensor"})
# the legacy CPU tensor types, a factory where what they are given is made, not copied: a literal,
# `range(n)` (`torch.LongTensor(range(L))` in every attention call: `torch.arange(L, device=...)`)
# or sizes. Given the host's data (a numpy batch) they copy it, as `torch.tensor` does
LEGACY = frozenset({"FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "ByteTensor", "CharTensor",
                    "ShortTensor", "IntTensor", "LongTensor", "BoolTensor", "Tensor"})
# tensor methods that keep a tensor where it is (a view, a dtype): `torch.LongTensor(...).expand_as(w)
# .to(device)` and `torch.randn(...).float().cuda()` still move a tensor made on the host
# the calls that copy host data into a new CPU tensor (when `_factory` does not make it from a literal
# or sizes): what a training step builds its batch with from a store kept in host memory
HOST_COPIES = frozenset({"tensor", "as_tensor", "from_numpy", "cat", "stack"}) | LEGACY
SAME_PLACE = frozenset({"expand", "expand_as", "view", "view_as", "reshape", "unsqueeze", "squeeze", "repeat",
                        "t", "transpose", "permute", "contiguous", "flatten", "float", "double", "half",
                        "bfloat16", "long", "int", "bool", "byte", "fill_", "zero_"})


# random draws from a population (`_drawn`): a replay buffer's `random.sample(self.buffer, n)`
DRAWS = frozenset({"random.sample", "random.choices", "numpy.random.choice"})
# calls that stack, convert or regroup what they are given: drawn rows stay drawn rows
REGROUP = frozenset({"numpy.stack", "numpy.array", "numpy.asarray", "numpy.concatenate", "numpy.vstack",
                     "numpy.hstack"})
REGROUP_BUILTINS = frozenset({"zip", "map", "list", "tuple"})
# methods that convert the rows they are called on (a scipy sparse slice densified, a dtype cast)
CONVERTS = frozenset({"toarray", "todense", "astype", "copy", "numpy", "tolist"})
MAX_DRAW_DEPTH = 10  # names, calls and returns followed before `_drawn` gives up

# torch functions whose result is where their tensor arguments are (`_computed`)
HOST_KEEPING = frozenset({"exp", "log", "sin", "cos", "tanh", "sigmoid", "sqrt", "rsqrt", "abs", "neg", "pow",
                          "outer", "polar", "cat", "stack", "where", "clamp", "floor", "ceil", "round",
                          "bernoulli"})
# numpy's array makers whose values the device makes as well (`torch.full`, `torch.rand`, ... with
# `device=`): a legacy type given one (`torch.FloatTensor(np.ones(n) * p)`) is a factory, not the host's data
NUMPY_FILLS = frozenset({"numpy.ones", "numpy.zeros", "numpy.full", "numpy.empty", "numpy.arange",
                         "numpy.linspace", "numpy.eye"})


def detect(index: SourceIndex, facts: Facts) -> None:
    for call in index.calls:
        if index.module_ran(call):
            _chained(index, facts, call)
            _host_data(index, facts, call)
            _copied_to_device(index, facts, call)
    _two_statements(index, facts)


def _copied_to_device(index: SourceIndex, facts: Facts, call: ast.Call) -> None:
    """`torch.tensor(self.obs[idx], device=self.device)`: rows drawn from a host store (`_drawn`) copied
    straight to a device on every training step, the same copy as `torch.tensor(...).to(device)`."""
    dev = kwarg(call, "device")
    q = index.qual(call.func) or ""
    if dev is None or q[6:] not in DATA_FACTORIES or not q.startswith("torch.") or not call.args:
        return
    if (index.devices.device_expr(dev) is not True or _loop_item(index, call, call.args[0])
            or not _drawn(index, call.args[0]) or not _copied_every_step(index, call, call.args[0])):
        return
    s = index.subject(facts, "cpu_to_device", call)
    put(s, "factory", q[6:])
    put(s, "target", index.text(dev))
    put(s, "in_loop", True)
    put(s, "host_data", True)


def _per_step(index: SourceIndex, node: ast.AST) -> bool:
    """Made on every training step: `Loops.per_step`, and not in a loop that no training step runs
    where the project shows where its steps are (a diffusion model's sampling loop after each epoch,
    in the model's file or the script's)."""
    return index.loops.per_step(node) and not (
        index.loops.project_trains() and index.loops.in_training_step(node) is False)


def _factory(index: SourceIndex, node: ast.AST) -> str | None:
    """The factory name when `node` is a CPU factory call (no `device=`, no `**kwargs`)."""
    if not isinstance(node, ast.Call):
        return None
    q = index.qual(node.func)
    if q and q.startswith("torch.") and q[6:] in LEGACY:
        made = (node.args and not node.keywords
                and (all(isinstance(a, ast.Constant) and type(a.value) is int for a in node.args)
                     # several sizes, however computed (`LongTensor(seq_len, batch_size)`): data is one sequence
                     or (len(node.args) > 1 and not any(isinstance(a, ast.Starred) for a in node.args))
                     or (len(node.args) == 1 and (_constant(node.args[0]) or _range(index, node.args[0])
                                                  or _filled(node.args[0]) or _numpy_fill(index, node.args[0])))))
        return q[6:] if made else None
    if not q or not q.startswith("torch.") or q[6:] not in FACTORIES:
        return None
    if any(kwarg(node, k) is not None for k in ("device", "generator")) or has_star_kwargs(node):
        return None  # a CPU generator cannot make a tensor on another device
    if q[6:] in DATA_FACTORIES and not (node.args and (_constant(node.args[0]) or _filled(node.args[0]))):
        return None  # the host's data (an environment's reward, a numpy batch): the copy carries it
    if q[6:] == "normal" and kwarg(node, "size") is None and len(node.args) < 3:
        return None  # torch.normal(mean_tensor, std): the device of its mean; a size makes it a factory
    return q[6:]


def _host_copy(index: SourceIndex, node: ast.AST) -> str | None:
    """The call's name when `node` copies host data into a new CPU tensor (`HOST_COPIES`, no
    `device=`): `torch.tensor(batch)`, `torch.from_numpy(a)`, `torch.FloatTensor(arr[idx])`,
    `torch.cat(samples)`; not a factory's tensor (a literal, sizes, `range()`: `_factory`)."""
    if not isinstance(node, ast.Call) or not node.args or _factory(index, node) is not None:
        return None
    q = index.qual(node.func)
    if not q or not q.startswith("torch.") or q[6:] not in HOST_COPIES:
        return None
    if kwarg(node, "device") is not None or has_star_kwargs(node):
        return None
    if q[6:] in LEGACY and (len(node.args) != 1 or node.keywords or _constant(node.args[0])):
        return None  # sizes (`FloatTensor(n, 3)`): made, not copied
    if q[6:] in ("cat", "stack") and isinstance(node.args[0], (ast.List, ast.Tuple)) and any(
            _moved_name(index, e) for e in node.args[0].elts):
        return None  # joins a tensor the step already moved: torch.cat runs on its device
    if _loop_item(index, node, node.args[0]):
        return None  # the batch the loop iterates (a DataLoader's, a generator's): data as it came
    if q[6:] not in ("cat", "stack") and not _drawn(index, node.args[0]):
        return None  # one value as it came (an environment's next observation): the data's own copy
    return q[6:]


def _helper_copy(index: SourceIndex, node: ast.AST) -> str | None:
    """`naive_sparse2tensor(data)` for `def naive_sparse2tensor(data): return torch.FloatTensor(
    data.toarray())`: the one function of this file of that name returns only host copies of drawn rows
    (`_host_copy`, whose data the function's parameters hold: what its calls pass, `_passed`)."""
    if not isinstance(node, ast.Call) or not node.args or (name := called_name(node)) is None:
        return None
    fns = index.functions.get(name, [])
    if len(fns) != 1:
        return None
    returns = [r.value for r in walk_scope(fns[0].body) if isinstance(r, ast.Return) and r.value is not None]
    copies = {_host_copy(index, r) for r in returns}
    return copies.pop() if len(copies) == 1 and None not in copies else None


def _loop_item(index: SourceIndex, at: ast.AST, data: ast.expr) -> bool:
    """`data` (or every element of a list of it) is rooted at a name a `for` loop around `at` binds to its
    items, the loop not over `range()`: the batch a DataLoader or generator hands the step (SimCLR's
    `for images, _ in loader: images = torch.cat(images, dim=0)`), its copy the loader's (PD003/PD017's),
    not rows drawn from a store kept in host memory."""
    parts = data.elts if isinstance(data, (ast.List, ast.Tuple)) else [data]
    names = {root_name(e) for e in parts}
    if None in names:
        return False
    for loop in index.ancestors(at):
        if isinstance(loop, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False
        if isinstance(loop, LOOPS) and isinstance(loop, (ast.For, ast.AsyncFor)) and not _over_range(index, loop.iter):
            bound = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
            if names <= bound:
                return True
    return False


def _over_range(index: SourceIndex, it: ast.expr) -> bool:
    """`range(n)`, `enumerate(range(n))`, `tqdm(range(n))`: a loop over step indices, not over batches."""
    while isinstance(it, ast.Call) and it.args and not _range(index, it):
        it = it.args[0]
    return _range(index, it)


def _moved_name(index: SourceIndex, node: ast.expr) -> bool:
    """`node` is a view, slice or cast of a name that its function binds to a move (`batch_y =
    batch_y.float().to(device)`, then `torch.cat([batch_y[:, :k, :], dec_inp])`): a device tensor."""
    while isinstance(node, (ast.Subscript, ast.Attribute, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    if not isinstance(node, ast.Name):
        return False
    scope = index.context(node)[0]
    return any(isinstance(v, ast.Call) and index.context(v)[0] is scope and index.devices.move_target(v) is not None
               for v in index.assigned.get(node.id, []))


def _drawn(index: SourceIndex, node: ast.expr, depth: int = 0) -> bool:
    """Rows drawn from a store by an index (`self.obs_buf[idxs]`, `state_arr[batch]`) or by a random
    draw (`random.sample(self.buffer, n)`: `DRAWS`), or a name this file binds only to such draws (an
    assignment or a tuple unpacking): a sampled batch, which `torch.cat`/`torch.stack` of stored rows is
    too, and so is what stacks or regroups a draw (`map(np.stack, zip(*batch))`: `REGROUP`); a
    comprehension over such draws or of them (GIN's `[graph.label for graph in batch_graph]`,
    `batch_graph = [train_graphs[idx] for idx in selected_idx]`); and what a function of the project
    returns where every return of it is a draw (`memory.sample(batch_size=...)`, a replay buffer's
    `sample` in another file: `_returns_drawn`). Not a value as it came (`torch.Tensor(next_obs)`) nor a
    fixed slice (`arr[0]`, `arr[:, 1:]`)."""
    if depth > MAX_DRAW_DEPTH:
        return False
    if isinstance(node, ast.Subscript):
        return not _fixed(node.slice)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return _drawn(index, node.elt, depth + 1) or any(_drawn(index, g.iter, depth + 1) for g in node.generators)
    if isinstance(node, ast.Starred):
        return _drawn(index, node.value, depth)
    if isinstance(node, ast.Name):
        values = [v for v in index.assigned.get(node.id, []) + index.unpacked.get(node.id, [])
                  if not any(n is node for n in ast.walk(v))]  # not the rebinding it is read in: `x = f(x)`
        scope = index.context(node)[0]
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # a function's own bindings of the name (its `for` loops' included) hide the file's others;
            # a parameter it never rebinds is what this file's calls pass it
            own = [v for v in values if index.context(v)[0] is scope] + _iterated(scope, node.id)
            values = own or (_passed(index, scope, node.id) if _parameter(scope, node.id) else values)
        # the binding that reaches the read where its function shows one before it (MAML's
        # `x_spt, ... = db_train.next()` then `torch.from_numpy(x_spt)`, not the test loop's rebinding after)
        before = [v for v in values if index.context(v)[0] is scope and v.lineno < node.lineno]
        if scope is not None and before:
            values = [max(before, key=lambda v: (v.lineno, v.col_offset))]
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            values = _appended(scope, node.id, values)
        return bool(values) and all(_drawn(index, v, depth + 1) for v in values)
    if isinstance(node, ast.Call):
        q = index.qual(node.func)
        if q in DRAWS:
            return True
        builtin = node.func.id if isinstance(node.func, ast.Name) and node.func.id not in index.aliases else None
        if q in REGROUP or builtin in REGROUP_BUILTINS:
            data = node.args[1:] if builtin == "map" else node.args
            return any(_drawn(index, a, depth + 1) for a in data)
        if isinstance(node.func, ast.Attribute) and node.func.attr in CONVERTS:
            return _drawn(index, node.func.value, depth + 1)
        return _returns_drawn(index, node, depth + 1)
    return False


def _returns_drawn(index: SourceIndex, call: ast.Call, depth: int) -> bool:
    """`call` calls a function of the project (this file's, or another file's of that name: a method
    called on an object) whose every return is a draw (`_drawn`). The candidates are the functions of
    that name that take the call's keywords and positional arguments and, where the run says which
    functions its profiled steps called, that it called: a replay buffer's `sample(batch_size)`, not the
    policy's `sample(state)` beside it."""
    name = called_name(call)
    if name is None or depth > MAX_DRAW_DEPTH:
        return False
    found = [(index, fn) for fn in index.functions.get(name, [])]
    found += [(p.syntax, fn) for p in index.loops.peers if isinstance(p.syntax, SourceIndex)
              for fn in p.syntax.functions.get(name, [])]
    method = isinstance(call.func, ast.Attribute)
    fits = [(ix, fn) for ix, fn in found if _takes(fn, call, method) and (ix.functions_called is None or ix.called(fn))]
    return bool(fits) and all(_all_returns_drawn(ix, fn, depth) for ix, fn in fits)


def _appended(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str, values: list[ast.expr]) -> list[ast.expr]:
    """`values`, an empty list among them standing for what `fn` appends to `name` (a replay buffer's
    `state_batch = []` filled with `state_batch.append(state)` from each sampled experience)."""
    out = [v for v in values if not (isinstance(v, ast.List) and not v.elts)]
    if len(out) == len(values):
        return values
    for n in walk_scope(fn.body):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("append", "extend")
                and isinstance(n.func.value, ast.Name) and n.func.value.id == name and len(n.args) == 1):
            out.append(n.args[0])  # a row appended, or rows extended: drawn alike
    return out


def _iterated(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> list[ast.expr]:
    """The iterables of `fn`'s `for` loops that bind `name` to their items (`for experience in batch`):
    an item of a draw is a drawn row."""
    return [n.iter for n in walk_scope(fn.body) if isinstance(n, (ast.For, ast.AsyncFor))
            and any(isinstance(t, ast.Name) and t.id == name for t in ast.walk(n.target))]


def _parameter(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    a = fn.args
    return name in {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}


def _passed(index: SourceIndex, fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> list[ast.expr]:
    """What the calls of `fn` in its file pass as its parameter `name` (`self.compute_loss(batch)` for
    `def compute_loss(self, batch)`), where each call binds it; none where one does not, or none calls."""
    out = []
    for call in index.calls_named(fn.name):
        given = argument(call, fn, name, bound=isinstance(call.func, ast.Attribute))
        if any(isinstance(x, ast.Starred) for x in call.args) or given is None:
            return []
        out.append(given)
    return out


def _takes(fn: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call, method: bool) -> bool:
    """`fn` accepts `call`'s keywords and number of positional arguments (a method's `self` aside)."""
    a = fn.args
    params = [x.arg for x in a.posonlyargs + a.args]
    if method and params[:1] in (["self"], ["cls"]):
        params = params[1:]
    if any(isinstance(x, ast.Starred) for x in call.args) or any(k.arg is None for k in call.keywords):
        return a.vararg is not None or a.kwarg is not None
    named = set(params) | {x.arg for x in a.kwonlyargs}
    return (len(call.args) <= len(params) or a.vararg is not None) and all(
        k.arg in named or a.kwarg is not None for k in call.keywords)


def _all_returns_drawn(index: SourceIndex, fn: ast.FunctionDef | ast.AsyncFunctionDef, depth: int) -> bool:
    returns = [r.value for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None
               and index.context(r)[0] is fn]
    return bool(returns) and all(
        all(_drawn(index, e, depth + 1) for e in r.elts) if isinstance(r, ast.Tuple) else _drawn(index, r, depth + 1)
        for r in returns)


def _fixed(s: ast.expr) -> bool:
    """An index of constants only: `0`, `-1`, `:`, `1:`, `(0, 2)`, `..., 0`."""
    if isinstance(s, ast.Slice):
        return all(p is None or _constant(p) for p in (s.lower, s.upper, s.step))
    if isinstance(s, ast.Tuple):
        return all(_fixed(e) for e in s.elts)
    return _constant(s) or (isinstance(s, ast.Constant) and s.value is Ellipsis)


def _copied_every_step(index: SourceIndex, node: ast.AST, data: ast.expr) -> bool:
    """Host data copied once per training step inside the step: the step's own function (one step per
    call) or the loop that takes the steps runs it, not behind a periodic guard, not once per epoch, and
    not in an environment's rollout (the observation must cross to act) unless `data` is rows drawn from a
    store (`_drawn`: an update inline in the loop that steps the environment, a dueling DQN's
    `torch.FloatTensor(batch_state).to(device)` of its replay sample)."""
    loops = index.loops
    if loops.in_training_step(node) is not True or loops.periodic(node):
        return False
    if loops.in_rollout(node) and not _drawn(index, data):
        return False
    return loops.enclosing_loop(node) is None or _per_step(index, node)


def _data(copy: ast.AST) -> ast.expr:
    """The host data a `_host_copy` call copies: its first argument."""
    assert isinstance(copy, ast.Call) and copy.args
    return copy.args[0]


def _not_run(index: SourceIndex, made: ast.AST, factory: str) -> bool:
    """The run watched the training steps, the factory is one its probe watches, and no line of `made`
    (the expression holding the factory call) made a host tensor in them, while no `if` within its
    function keeps it to the accelerator or to every N steps (`_kept_branch`): the line did not run in the step."""
    if _kept_branch(index, made):
        return False
    ran = index.factories_ran
    if ran is not None and factory in WATCHED:
        first: int = getattr(made, "lineno", 0)
        last: int = getattr(made, "end_lineno", None) or first
        return not any(line in ran for line in range(first, last + 1))
    return _never_called(index, made)


def _move_not_run(index: SourceIndex, move: ast.Call) -> bool:
    """The run watched the steps' moves (`index.moves_ran`: every `.to(device)` / `.cuda()` / `.type_as()`
    line of the user's, whatever the tensor) and no line of `move` moved anything in them, while no `if`
    within its function keeps it to the accelerator or to every N steps (`_kept_branch`): the move did not
    run in the step, whatever made its tensor (a legacy type's literal, which the probe does not watch: a
    distributed helper's `torch.IntTensor([1]).to("cuda")` after `if world_size == 1: return`)."""
    ran = index.moves_ran
    if ran is None or _kept_branch(index, move):
        return False
    last: int = getattr(move, "end_lineno", None) or move.lineno
    return not any(line in ran for line in range(move.lineno, last + 1))


def _never_called(index: SourceIndex, node: ast.AST) -> bool:
    """The function holding `node` was not called in the run's profiled steps (`index.functions_called`,
    cProfile's), is not on the step's call chain (entered before them), and no call of its name in this
    file sits behind an `if` that keeps it to the accelerator (`_kept_branch`): an optimizer class the
    script defines but does not use (LARS beside the Adam it trains with), a helper of another mode."""
    called = index.functions_called
    fn = next((p for p in index.ancestors(node) if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if called is None or fn is None:
        return False
    first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    end = fn.end_lineno or fn.lineno
    if first in called or fn.lineno in called or any(first <= line <= end for line in index.chain_lines):
        return False
    return not any(called_name(c) == fn.name and _kept_branch(index, c) for c in index.calls)


def _kept_branch(index: SourceIndex, node: ast.AST) -> bool:
    """An `if` (or conditional expression) around `node`, within its function, that a few watched
    steps do not settle: one whose test the source decides on a CUDA device (`Devices.on_cuda`:
    `torch.cuda.is_available()`, `use_cuda`, `device.type == "cuda"`) and that takes `node`'s branch
    there (a CPU run takes the other), or one whose test has a `%` (every N steps: the watch may fall
    between two)."""
    child = node
    for parent in index.ancestors(node):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
            if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(parent.test)):
                return True
            on_cuda = index.devices.on_cuda(parent.test)
            if on_cuda is not UNKNOWN:
                in_body = child in parent.body if isinstance(parent, ast.If) else child is parent.body
                if bool(on_cuda) == in_body:
                    return True
        child = parent
    return False


def _range(index: SourceIndex, node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
            and "range" not in index.aliases)  # the builtin, not an import of that name


def _filled(node: ast.expr) -> bool:
    """A list of one value repeated (`[word_map['<end>']] * b`, `n * [pad]`): a fill, which the device
    makes as well (`torch.full((b,), v, device=...)`); the value a literal, a name or an index of one by a
    literal (a vocabulary's id), not a row of the host's data."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
        return False
    seq = node.left if isinstance(node.left, (ast.List, ast.Tuple)) else node.right
    if not isinstance(seq, (ast.List, ast.Tuple)) or len(seq.elts) != 1:
        return False
    v = seq.elts[0]
    return _constant(v) or isinstance(v, ast.Name) or (
        isinstance(v, ast.Subscript) and isinstance(v.value, (ast.Name, ast.Attribute)) and _constant(v.slice))


def _constant(node: ast.expr) -> bool:
    """A literal: a number, a list or tuple of numbers (`torch.tensor(0.)`, `torch.tensor([1, 2])`)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return _constant(node.operand)
    if isinstance(node, (ast.List, ast.Tuple)):
        return all(_constant(e) for e in node.elts)
    return False


def _chained(index: SourceIndex, facts: Facts, call: ast.Call) -> None:
    """`torch.randn(...).cuda()`, `torch.zeros(...).to(device)`, and a tensor computed from a host
    factory (`torch.exp(-math.log(p) * torch.arange(half) / half).to(t.device)`, `_computed`)."""
    if not isinstance(call.func, ast.Attribute):
        return
    made = call.func.value
    while (isinstance(made, ast.Call) and isinstance(made.func, ast.Attribute)
           and made.func.attr in SAME_PLACE):
        made = made.func.value
    fac = _factory(index, made) or _computed(index, made)
    host = None if fac else (_host_copy(index, made) or _helper_copy(index, made))
    target = index.devices.move_target(call) if fac or host else None
    if target is None or (host and not _copied_every_step(index, call, _data(made))) or (fac and _not_run(index, made, fac)) or (
            _move_not_run(index, call)):
        return
    s = index.subject(facts, "cpu_to_device", call)
    put(s, "factory", fac or host)
    put(s, "target", target)
    put(s, "in_loop", _per_step(index, call) if fac else True)
    if host:
        put(s, "host_data", True)


def _computed(index: SourceIndex, node: ast.AST, depth: int = 0) -> str | None:
    """The factory a host tensor is computed from: arithmetic (`-c * torch.arange(n) / n`) and torch's
    elementwise and joining functions (`torch.exp(...)`, `torch.cat([torch.arange(b) for ...])`) over a
    host factory's tensor stay on the host, since a tensor of one or more dimensions on the CPU cannot be
    combined with one on a GPU: the code runs on its GPU only if the result is a host tensor, which its
    move then copies. Not the 0-dimensional ones (`torch.tensor(2.)`, legacy types: a CPU scalar may
    join a GPU tensor, and the result is on the GPU)."""
    if depth > 6:
        return None
    if isinstance(node, ast.Call):
        fac = _factory(index, node) if depth else None
        if fac is not None:
            # a legacy type over a numpy fill is an array of one or more dimensions, not a CPU scalar
            filled = fac in LEGACY and len(node.args) == 1 and _numpy_fill(index, node.args[0])
            return None if fac in DATA_FACTORIES or (fac in LEGACY and not filled) else fac
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in SAME_PLACE:
            return _computed(index, f.value, depth + 1)
        q = index.qual(f) or ""
        if not (q.startswith("torch.") and q[6:] in HOST_KEEPING) or kwarg(node, "out") is not None:
            return None
        parts: list[ast.AST] = list(node.args)
    elif isinstance(node, ast.BinOp):
        parts = [node.left, node.right]
    elif isinstance(node, ast.UnaryOp):
        parts = [node.operand]
    elif isinstance(node, (ast.List, ast.Tuple)):
        parts = list(node.elts)
        if any(isinstance(e, ast.Name) and _computed(index, e, depth + 1) is None for e in parts):
            return None  # joins a name bound to no host factory's tensor (the sample it pads): the data's copy
    elif isinstance(node, ast.ListComp):
        parts = [node.elt]
    elif isinstance(node, ast.Name):
        value = _bound(index, node)
        if value is None or (not depth and _factory(index, _wrapped(index, value)) is not None):
            return None  # a factory's tensor bound to a name and moved later: `_two_statements`'s shape
        parts = [value]
    else:
        return None
    return next((f for f in (_computed(index, p, depth + 1) for p in parts) if f), None)


def _bound(index: SourceIndex, node: ast.Name) -> ast.expr | None:
    """The value its function binds `node`'s name to before the read (the latest such assignment,
    not the one it is read in: `x = f(x)`); None where the function binds it nowhere before it."""
    scope = index.context(node)[0]
    if scope is None:
        return None
    before = [v for v in index.assigned.get(node.id, [])
              if index.context(v)[0] is scope and v.lineno < node.lineno and not any(n is node for n in ast.walk(v))]
    return max(before, key=lambda v: (v.lineno, v.col_offset)) if before else None


def _numpy_fill(index: SourceIndex, node: ast.expr) -> bool:
    """An array numpy makes rather than holds (`NUMPY_FILLS`, `np.random.*`), or one scaled or shifted by
    a number or a name (`np.ones(n) * drop_rate`): values a device-side factory makes as well."""
    if isinstance(node, ast.BinOp):
        return (_numpy_fill(index, node.left) and isinstance(node.right, (ast.Constant, ast.Name))) or (
            _numpy_fill(index, node.right) and isinstance(node.left, (ast.Constant, ast.Name)))
    if not isinstance(node, ast.Call):
        return False
    q = index.qual(node.func) or ""
    return q in NUMPY_FILLS or q.startswith("numpy.random.")


def _host_data(index: SourceIndex, facts: Facts, call: ast.Call) -> None:
    """`Tensor(np.random.normal(...))`, `LongTensor(labels_np)`: host data to a CUDA tensor type."""
    if len(call.args) != 1 or call.keywords:
        return
    kind = index.devices.cuda_tensor_type(call.func)
    if kind is None or not _host_array(index, call.args[0]):
        return
    s = index.subject(facts, "cpu_to_device", call)
    put(s, "factory", f"cuda.{kind}")
    put(s, "target", "cuda")
    put(s, "in_loop", _per_step(index, call))


def _host_array(index: SourceIndex, node: ast.expr, depth: int = 0) -> bool:
    """A numpy call (`np.random.normal(...)`, `np.zeros(...)`), a list, or a name bound only to those."""
    if isinstance(node, (ast.List, ast.ListComp)):
        return True
    if isinstance(node, ast.Call):
        q = index.qual(node.func)
        return bool(q and q.startswith("numpy."))
    if isinstance(node, ast.Name) and depth < 3:
        values = index.assigned.get(node.id, [])
        return bool(values) and all(_host_array(index, v, depth + 1) for v in values)
    return False


def _two_statements(index: SourceIndex, facts: Facts) -> None:
    """`x = torch.randn(...)` then, a few statements later, `x = x.to(device)` / `x = x.cuda()`."""
    for block in _blocks(index.nodes):
        for i, stmt in enumerate(block):
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)):
                continue
            made = _wrapped(index, stmt.value)
            fac = _factory(index, made)
            sources: list[ast.expr] = [made]
            if fac is None:
                joined = _joined_factories(index, made)
                if joined:
                    fac, sources = _factory(index, joined[0]), list(joined)
            host = None if fac else _host_copy(index, made)
            if not (fac or host) or not index.module_ran(stmt) or (host and not _copied_every_step(index, stmt, _data(made))) or (
                    fac and all(_not_run(index, m, _factory(index, m) or fac) for m in sources)):
                continue
            name = stmt.targets[0].id
            between: set[str] = set()  # names assigned between the two statements
            filled = False  # the host wrote data into the made tensor in between: a batch, not a factory's values
            for later in block[i + 1:i + 6]:
                move = _rebind_move(later, name) or _guarded_move(later, name) or _returned_move(later, name)
                if move is not None:
                    target = index.devices.move_target(move)
                    dev_names = {n.id for n in ast.walk(move) if isinstance(n, ast.Name)} - {name}
                    if target is not None and not dev_names & between and not _move_not_run(index, move):
                        s = index.subject(facts, "cpu_to_device", stmt)
                        index.locate(s, move)
                        put(s, "factory", fac or host)
                        put(s, "target", target)
                        put(s, "in_loop", _per_step(index, stmt) if fac else True)
                        if host or filled:
                            put(s, "host_data", True)
                        if filled and not host:
                            put(s, "filled", True)  # built here from Python values, not drawn from a store
                    break
                if _fills(later, name):
                    filled = True  # filled in place on the host: still the tensor made, now holding the host's data
                    continue
                if _rewrapped(index, later, name):
                    continue  # wrapped in Variable: the same tensor
                if isinstance(later, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.Return,
                                      ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or any(
                        isinstance(n, ast.Name) and n.id == name for n in ast.walk(later)):
                    break
                between |= {n.id for n in ast.walk(later) if isinstance(n, ast.Name)
                            and isinstance(n.ctx, ast.Store)}


def _fills(stmt: ast.stmt, name: str) -> bool:
    """`stmt` (a loop, an assignment) uses `name` only to write into it by index (`inp[bi] = char_tensor(
    chunk)`, `x[i] += 1`): the tensor the factory made, filled on the host row by row (char-rnn's batch
    before its move), not read, replaced or handed on."""
    stores = {id(_indexed(t)) for n in ast.walk(stmt) if isinstance(n, (ast.Assign, ast.AugAssign))
              for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
              if isinstance(t, ast.Subscript) and isinstance(_indexed(t), ast.Name)}
    uses = [n for n in ast.walk(stmt) if isinstance(n, ast.Name) and n.id == name]
    return bool(uses) and all(id(n) in stores for n in uses)


def _indexed(target: ast.Subscript) -> ast.expr:
    """What a write by index writes into: `x` of `x[i]` and of a row's slice, `x[i][:n]`."""
    node: ast.expr = target
    while isinstance(node, ast.Subscript):
        node = node.value
    return node


def _rewrapped(index: SourceIndex, stmt: ast.stmt, name: str) -> bool:
    """`name = Variable(name)` (an identity since torch 0.4): the same tensor under the same name."""
    return (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id == name and isinstance(stmt.value, ast.Call) and len(stmt.value.args) == 1
            and isinstance(stmt.value.args[0], ast.Name) and stmt.value.args[0].id == name
            and _wrapped(index, stmt.value) is stmt.value.args[0])


def _rebind_move(stmt: ast.stmt, name: str) -> ast.Call | None:
    """The `name.to(...)` / `name.cuda(...)` call of `name = name.to(...)`, else None."""
    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id == name and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr in ("to", "cuda")
            and isinstance(stmt.value.func.value, ast.Name) and stmt.value.func.value.id == name):
        return stmt.value
    return None


def _returned_move(stmt: ast.stmt, name: str) -> ast.Call | None:
    """The `name.to(...)` / `name.cuda(...)` of a `return` that hands the moved tensor on (`return
    (batch_text.to(device), lengths)`: a label converter's padded batch), else None."""
    if not isinstance(stmt, ast.Return) or stmt.value is None:
        return None
    return next((n for n in ast.walk(stmt.value) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr in ("to", "cuda") and isinstance(n.func.value, ast.Name)
                 and n.func.value.id == name), None)


def _guarded_move(stmt: ast.stmt, name: str) -> ast.Call | None:
    """The move of `if use_cuda: name = name.cuda()` (the old scripts' way to the GPU: a statement of
    the `if`'s body moves the tensor just made, the statements before it in the body not touching it:
    DGI's `if torch.cuda.is_available(): shuf_fts = shuf_fts.cuda(); lbl = lbl.cuda()`), else None."""
    if not (isinstance(stmt, ast.If) and stmt.body) or any(
            isinstance(n, ast.Name) and n.id == name for n in ast.walk(stmt.test)):
        return None
    for inner in stmt.body:
        move = _rebind_move(inner, name)
        if move is not None:
            return move
        if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(inner)):
            return None
    return None


def _joined_factories(index: SourceIndex, node: ast.expr) -> list[ast.Call]:
    """The factory calls a `torch.cat` / `torch.stack` of names joins, where every name its function
    binds only to a CPU factory call (DGI's `lbl_1 = torch.ones(b, n)`, `lbl_2 = torch.zeros(b, n)`,
    `lbl = torch.cat((lbl_1, lbl_2), 1)`): the join is made on the host from factories' tensors, a
    factory's tensor too (not host data); else []."""
    if not (isinstance(node, ast.Call) and node.args and index.qual(node.func) in ("torch.cat", "torch.stack")
            and isinstance(node.args[0], (ast.List, ast.Tuple)) and node.args[0].elts):
        return []
    scope = index.context(node)[0]
    out: list[ast.Call] = []
    for e in node.args[0].elts:
        if not isinstance(e, ast.Name):
            return []
        values = [v for v in index.assigned.get(e.id, []) if index.context(v)[0] is scope]
        made = [_wrapped(index, v) for v in values]
        if not made or not all(isinstance(m, ast.Call) and _factory(index, m) is not None for m in made):
            return []
        out.extend(m for m in made if isinstance(m, ast.Call))
    return out


def _wrapped(index: SourceIndex, node: ast.expr) -> ast.expr:
    """The call a chain of views and dtype casts (`SAME_PLACE`) or `autograd.Variable(...)` (an identity
    since torch 0.4) wraps: `Variable(torch.zeros(b, t)).long()` is torch.zeros' tensor."""
    while isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in SAME_PLACE and isinstance(f.value, ast.Call):
            node = f.value
        elif node.args and index.qual(f) in ("torch.autograd.Variable", "torch.autograd.variable.Variable"):
            node = node.args[0]
        else:
            break
    return node


def _blocks(nodes: list[ast.AST]) -> Iterator[list[ast.stmt]]:
    """Every statement list (a body, an else, a finally) of the file."""
    for node in nodes:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block
