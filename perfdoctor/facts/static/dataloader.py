"""DataLoader constructions (PD002, PD003): one `dataloader` subject per call, with the settings
written as literals (`num_workers`, `pin_memory`, `persistent_workers`, `batch_size`; torch's
default where the argument is absent and no `*args` / `**kwargs` could carry it), how the keyword
arguments were passed (`kwargs_style`), and, where the loop over it moves a batch to a device,
`feeds_cuda` and `non_blocking` (absent, never False, when no move is found).

`trains`: True where a loop over its batches takes a training step (`Loops.trains`), False
where its loops take none while another loop of the file does, or all sit in an evaluation function
(`evaluate`, `eval_split`, `test`: an evaluation or test loader, its copies are not on the training
step), absent otherwise.

Lightning and Hugging Face Accelerate move batches themselves: a loader that they iterate
(`framework_stage`: built in a `*_dataloader` hook, given to a Trainer's `fit` / `validate` / `test` /
`predict`, to Fabric's `setup_dataloaders` or to `accelerator.prepare`) feeds CUDA wherever the script
runs on a GPU, with no `.to(device)` in the user's code (Lightning's copies are non_blocking on CUDA);
a Trainer's training loader trains, its others do not.

`pin_memory_on_cuda` is the value pin_memory takes when the script runs on a CUDA device:
`pin_memory=use_cuda`, `pin_memory=torch.cuda.is_available()` and a kwargs dict that gets
`pin_memory: True` on the accelerator path (`if use_cuda: kwargs.update({"pin_memory": True})`)
are True there, whatever a CPU run passed (`Devices.on_cuda`); absent where the source does not say.
`num_workers_on_cuda` likewise (pytorch/examples' `cuda_kwargs = {'num_workers': 1, ...}` merged in
only where CUDA is used): a CPU run of a CUDA script is judged with the workers its GPU path has."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.devices import UNKNOWN, Devices
from perfdoctor.facts.static.index.settings import first_value, option_default, project_files
from perfdoctor.facts.static.index.syntax import Syntax, argument, dotted, has_star_kwargs, kwarg, root_name, walk_scope
from perfdoctor.usercode import kwargs_style

# words of evaluation rather than training: in a function's name (`evaluate`, `eval_split`, `test`,
# `validate`, `run_validation`) or a loader's (`eval_dataloader`, `val_loader`, `test_dl`)
_EVAL_NAME = re.compile(r"(^|_)(eval|evaluate|evaluation|test|val|valid|validate|validation)($|_)", re.I)
_TRAIN_NAME = re.compile(r"(^|_)train", re.I)
DATALOADER = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
_HOOK = re.compile(r"^(train|val|test|predict)_dataloader$")  # Lightning's dataloader hooks
_EVAL_STAGES = ("val", "test", "predict")
# a Lightning Trainer's methods that iterate loaders: their loader parameters after the model
_TRAINER_CALLS = {"fit": ("train_dataloaders", "val_dataloaders"), "validate": ("dataloaders",),
                  "test": ("dataloaders",), "predict": ("dataloaders",)}
_TRAINER_KWARGS = frozenset({"train_dataloaders", "val_dataloaders", "dataloaders"})
# DataLoader's positional parameters, in order (torch 2.x).
_POSITIONAL = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers",
               "collate_fn", "pin_memory", "drop_last", "timeout", "worker_init_fn",
               "multiprocessing_context", "generator")
# name: (type of a literal value, value when the argument is absent; None = leave the fact absent)
_FACTS = {"num_workers": (int, 0), "pin_memory": (bool, False),
          "persistent_workers": (bool, False), "batch_size": (int, None)}


def detect(index: SourceIndex, facts: Facts) -> None:
    for call in index.calls:
        if index.qual(call.func) in DATALOADER:
            _dataloader(index, facts, call)


def _dataloader(index: SourceIndex, facts: Facts, call: ast.Call) -> None:
    s = index.subject(facts, "dataloader", call)
    star_kw = has_star_kwargs(call)
    put(s, "kwargs_style", kwargs_style(call))
    given = _given(call)
    star_args = any(isinstance(a, ast.Starred) for a in call.args)
    for name, (typ, default) in _FACTS.items():
        if name in given:
            try:
                value = ast.literal_eval(given[name])
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            if type(value) is typ:
                put(s, name, value, "count" if typ is int else "")
        elif default is not None and not star_kw and not star_args:
            put(s, name, default, "count" if typ is int else "")
    if _follows_cpus(index, given.get("num_workers")):
        put(s, "workers_follow_cpus", True)
    default_batch = _default_batch(index, given.get("batch_size"), call)
    if default_batch is not None:
        put(s, "default_batch_size", default_batch, "count")
    on_cuda = pin_memory_on_cuda(index, call)
    if isinstance(on_cuda, bool):
        put(s, "pin_memory_on_cuda", on_cuda)
    workers = on_cuda_path(index, call, "num_workers", 0)
    if type(workers) is int and workers >= 0:
        put(s, "num_workers_on_cuda", workers, "count")
    # the loader's names and the loops over it, found once for the facts below
    names = loader_names(index, call)
    over = batch_loops(index, call, names)
    moves = batch_moves(index, call, over)
    stage = framework_stage(index, call, names)
    if moves:
        put(s, "feeds_cuda", True)
        put(s, "non_blocking", all(
            isinstance(v := kwarg(m, "non_blocking"), ast.Constant) and v.value is True for m, _ in moves))
    elif stage is not None and not index.frameworks.gives_framework_the_cpu():
        # the framework moves these batches to the model's device (unless this file gives it the CPU,
        # or a device the source does not spell out: `accelerator=args.accelerator`)
        put(s, "feeds_cuda", True)
        if stage != "accelerate":  # Lightning copies with non_blocking on CUDA; Accelerate as configured
            put(s, "non_blocking", True)
    loops = [loop for loop, _ in over]
    if any(index.loops.trains(loop) for loop in loops) or stage == "train":
        put(s, "trains", True)
    elif stage in _EVAL_STAGES or loops and (index.loops.has_training_loop() or all(
            _EVAL_NAME.search(index.function_name(loop)) for loop in loops)):
        put(s, "trains", False)  # an evaluation loader beside the training one, or in an eval function
    elif not loops and _eval_named(names):
        # iterated in no file read (a helper module's `get_dataloaders` returns it): its name says
        put(s, "trains", False)


_CPU_COUNTS = frozenset({"os.cpu_count", "os.sched_getaffinity", "os.process_cpu_count", "multiprocessing.cpu_count",
                         "psutil.cpu_count", "torch.get_num_threads"})


def _follows_cpus(index: SourceIndex, given: ast.expr | None) -> bool:
    """Whether a worker count is computed from the machine's CPUs (`4 * len(os.sched_getaffinity(0))`,
    `os.cpu_count() // 2`, or a name bound to such a value): it is as many on the GPU machine as its
    CPUs make it, so this machine's count judges it too."""
    values = index.assigned.get(given.id, []) if isinstance(given, ast.Name) else [given] if given else []
    return any(isinstance(n, ast.Call) and index.qual(n.func) in _CPU_COUNTS
               for v in values for n in ast.walk(v))


def _default_batch(index: SourceIndex, given: ast.expr | None, call: ast.Call) -> int | None:
    """The batch size a loader gets unless the user changes it, where it reads a user's option: the
    literal default of the argparse option it reads (`batch_size=args.batch_size`, `self.args.batch_size`, or a name bound
    to one), in this file or where the project parses its arguments; or, for a parameter of the function
    that builds the loader, the option every caller fills it from, in this file or the project's others
    (`def get(batch_size, ...)` in dataset.py, `dataset.get(batch_size=args.batch_size)` in train.py)."""
    values: list[ast.expr | None] = [given]
    if isinstance(given, ast.Name):
        bound = first_value(index, given)
        values = [bound] if bound is not None else _arguments(index, given.id, call)
    defaults = {option_default(index, v.attr) if isinstance(v, ast.Attribute) else None for v in values}
    if len(defaults) != 1:
        return None
    (value,) = defaults
    return value if type(value) is int and value > 0 else None


def _arguments(index: SourceIndex, param: str, call: ast.Call) -> list[ast.expr | None]:
    """What the callers of the function around `call` pass for its parameter `param`: this file's calls
    of it, and the project's other files' calls of `<this module>.name(...)` or of the name they import
    (`Loops.peers`); [] where the function has no such parameter or no caller passes it."""
    return [v for v, _ in _arguments_in(index, param, call)]


def _arguments_in(index: Syntax, param: str, call: ast.Call, files: list[Syntax] | None = None,
                  depth: int = 0) -> list[tuple[ast.expr | None, Syntax]]:
    """`_arguments`, each with the file (its `Syntax`) whose call passes it: a name there reads by that
    file's assignments (`use_gpu = torch.cuda.is_available()` in train.py, the loader in data.py).
    A method is called on an object whose name says nothing of its module (`dg.generate_dataloader(...,
    batch_size=batch_size)` in run.py): such a call counts where it passes `param` by keyword. Where a
    caller passes its own parameter on (`def main(..., batch_size)` passing `batch_size=batch_size`),
    what main's callers pass for it (main's default where one passes nothing), two callers deep."""
    scope, _ = index.context(call)
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    params = [a.arg for a in (*scope.args.posonlyargs, *scope.args.args)]
    if param not in params and param not in [a.arg for a in scope.args.kwonlyargs]:
        return []
    method = bool(params) and params[0] in ("self", "cls")
    module = os.path.splitext(os.path.basename(index.file))[0]
    files = files if files is not None else project_files(index)
    calls: list[tuple[ast.Call, Syntax]] = [(c, index) for c in index.callers(scope.name)]
    for peer in files:
        if peer is index or peer.file == index.file:
            continue
        calls += [(c, peer) for c in peer.calls_named(scope.name)
                  if isinstance(c.func, ast.Name) and str(peer.qual(c.func) or "").rsplit(".", 1)[0].endswith(module)
                  or isinstance(c.func, ast.Attribute) and dotted(c.func.value) is not None
                  and (str(dotted(c.func.value)).rsplit(".", 1)[-1] == module
                       or method and kwarg(c, param) is not None)]
    out: list[tuple[ast.expr | None, Syntax]] = []
    for c, where in calls:
        if any(isinstance(a, ast.Starred) for a in c.args) or has_star_kwargs(c):
            return []  # what it passes cannot be told
        value = argument(c, scope, param, bound=True)
        if isinstance(value, ast.Name) and depth < 2 and _passed_on(where, value, c):
            deeper = _arguments_in(where, value.id, c, files, depth + 1)
            if not deeper:
                return []  # the caller's parameter, which nothing says how its callers fill
            default = _default_of(where, value.id, c)
            out += [(v, w) if v is not None else (default, where) for v, w in deeper]
            continue
        out.append((value, where))
    return out


def _passed_on(where: Syntax, name: ast.Name, call: ast.Call) -> bool:
    """`name`, an argument of `call`, is a parameter of the function around the call that the function
    does not rebind before it: the caller passes its own parameter on."""
    fn, _ = where.context(call)
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or name.id not in [
            a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]:
        return False
    end = fn.end_lineno or fn.lineno
    return not any(fn.lineno <= v.lineno <= end for v in where.assigned.get(name.id, []))


def _default_of(where: Syntax, param: str, call: ast.Call) -> ast.expr | None:
    """The default of the parameter `param` of the function around `call`, None where it has none."""
    fn, _ = where.context(call)
    return _defaults(fn).get(param) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _defaults(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, ast.expr]:
    """A function's parameters that have a default, by name."""
    positional = [*fn.args.posonlyargs, *fn.args.args]
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(fn.args.defaults):], fn.args.defaults))
    defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None})
    return defaults


def _parameter_on_cuda(index: SourceIndex, param: str, call: ast.Call) -> object:
    """A parameter of the function that builds the loader (`def make_dataset(..., pin_memory=False)`,
    `DataLoader(..., pin_memory=pin_memory)`) on a CUDA device: what every caller passes for it, read in
    the caller's file (`make_dataset(..., pin_memory=use_gpu)` with `use_gpu = torch.cuda.is_available()`),
    the parameter's default where a caller passes nothing; UNKNOWN where the callers disagree, pass
    what the source does not decide, or there are none."""
    scope, _ = index.context(call)
    passed = _arguments_in(index, param, call)
    if not passed or not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return UNKNOWN
    defaults = _defaults(scope)
    values = set()
    for value, where in passed:
        if value is None:
            value, where = defaults.get(param), index
            if value is None:
                return UNKNOWN
        devices = index.devices if where is index else Devices(where)
        v = devices.on_cuda(value)
        if v is UNKNOWN or not isinstance(v, (bool, int, str)):
            return UNKNOWN
        values.add(v)
    return values.pop() if len(values) == 1 else UNKNOWN


def _eval_named(names: list[LoaderName]) -> bool:
    """Whether a loader's names call it an evaluation loader (`eval_dataloader`, `self.val_loader`,
    `test_dl`) and none a training one."""
    last = [name.rsplit(".", 1)[-1] for name, _, _ in names]
    return any(_EVAL_NAME.search(n) for n in last) and not any(_TRAIN_NAME.search(n) for n in last)


def framework_stage(index: SourceIndex, call: ast.Call, names: list[LoaderName] | None = None) -> str | None:
    """Where a training framework iterates this DataLoader and moves its batches to the model's device:
    "train" or "val"/"test"/"predict" for a loader built in a class's `<stage>_dataloader` method (a
    LightningModule's or LightningDataModule's hook) or given to a Lightning Trainer's `fit` /
    `validate` / `test` / `predict`; "fabric" for one given to Fabric's `setup_dataloaders` (without
    `move_to_device=False`), "accelerate" for one given to Hugging Face Accelerate's
    `accelerator.prepare` (an `Accelerator` without `device_placement=False`): for these two the
    loops over it say whether it trains; None elsewhere. A loader is given directly or by one of its
    names (`names`, else `loader_names`)."""
    scope = index.context(call)[0]
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and isinstance(index.parents.get(scope), ast.ClassDef):
        m = _HOOK.match(scope.name)
        if m:
            return m.group(1)
    if names is None:
        names = loader_names(index, call)

    def given(node: ast.AST | None, c: ast.Call) -> bool:
        where = index.context(c)[0]
        return node is call or node is not None and any(dotted(node) == name and (anywhere or where is sc)
                                                        for name, sc, anywhere in names)

    for c in index.calls:
        attr = c.func.attr if isinstance(c.func, ast.Attribute) else None
        if attr == "setup_dataloaders":
            move = kwarg(c, "move_to_device")
            if not (isinstance(move, ast.Constant) and move.value is False) and any(given(a, c) for a in c.args):
                return "fabric"
        elif attr == "prepare" and isinstance(c.func, ast.Attribute) and index.frameworks.accelerator_places(c.func.value):
            if any(given(a, c) for a in c.args):
                return "accelerate"
        elif attr in _TRAINER_CALLS:
            # fit(model, train_dataloaders, val_dataloaders, datamodule), validate/test/predict(model, dataloaders):
            # by Lightning's own keywords, or by position where the receiver is a Trainer
            named = {k.arg: k.value for k in c.keywords if k.arg in _TRAINER_KWARGS}
            positional = (dict(zip(_TRAINER_CALLS[attr], c.args[1:]))
                          if isinstance(c.func, ast.Attribute) and index.frameworks.lightning_trainer(c.func.value) else {})
            for arg, node in {**positional, **named}.items():
                if given(node, c):
                    return "train" if arg == "train_dataloaders" else "val"
    return None


def batch_loops(index: SourceIndex, dl_call: ast.Call, names: list[LoaderName] | None = None
                ) -> list[tuple[ast.AST, set[str]]]:
    """The loops over this loader's batches, each with the names its batch is bound to:
    `for ... in <loader>` (also `enumerate(loader)`, `tqdm(loader)`, `zip(...)`), and loops that
    draw batches with `next()` from `iter(<loader>)` (`while True: batch = next(it)`), wherever
    the loader goes by one of its names (`names`, else `loader_names`)."""
    if names is None:
        names = loader_names(index, dl_call)

    def is_loader(node: ast.AST, where: ast.AST) -> bool:
        scope = index.context(where)[0]
        return node is dl_call or any(dotted(node) == name and (anywhere or scope is sc)
                                      for name, sc, anywhere in names)

    # `it = iter(loader)`: draws from `it` are batches too
    iterators = {t.id for n in index.nodes_of(ast.Assign) if _iter_of(n.value, is_loader, n)
                 for t in n.targets if isinstance(t, ast.Name)}
    out: list[tuple[ast.AST, set[str]]] = []
    for loop in index.nodes_of(ast.For, ast.AsyncFor):
        it = loop.iter
        candidates = [it] + (list(it.args) if isinstance(it, ast.Call) and it is not dl_call else [])
        if any(is_loader(c, loop) for c in candidates):
            out.append((loop, {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}))
    for n in index.nodes_of(ast.Assign):  # `batch = next(it)` / `batch = next(iter(loader))` inside a loop
        if not (isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)
                and n.value.func.id == "next" and n.value.args):
            continue
        src = n.value.args[0]
        if not ((isinstance(src, ast.Name) and src.id in iterators) or _iter_of(src, is_loader, n)):
            continue
        draws_in = index.loops.enclosing_loop(n)
        if draws_in is None:
            continue
        drawn = {m.id for t in n.targets for m in ast.walk(t) if isinstance(m, ast.Name)}
        for known, tracked in out:
            if known is draws_in:
                tracked |= drawn
                break
        else:
            out.append((draws_in, drawn))
    return out


LoaderName = tuple[str, "ast.AST | None", bool]  # (a name of the loader, the scope it is bound in, in any scope)


def loader_names(index: SourceIndex, dl_call: ast.Call) -> list[LoaderName]:
    """The names this DataLoader is known by: the one it is assigned to (`loader = DataLoader(...)`,
    or `self.loader = ...`, known in any scope); where a function of this file returns it
    (`return DataLoader(...)`, `return loader`, `return train_loader, val_loader`), the names its
    callers bind that result to (`train_dl, eval_dl = get_dataloaders(...)`); and, one level on, the
    parameter of a function or class of this file that one of those names is passed to
    (`train(model, loader)` with `def train(model, train_loader)`, `Trainer(model, loader)` with
    `def __init__(self, model, train_data)`) and the attribute that function keeps it in
    (`self.train_data = train_data`)."""
    parent = index.parents.get(dl_call)
    scope = index.context(dl_call)[0]
    direct: list[tuple[str, ast.AST | None]] = []
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(
            parent.targets[0], (ast.Name, ast.Attribute)):
        bound = dotted(parent.targets[0])
        if bound:
            direct.append((bound, scope))
    direct += _bound_by_callers(index, dl_call, direct[0][0] if direct else None, scope)
    names: list[LoaderName] = []
    for bound, where in direct:
        names.append((bound, where, "." in bound or where is None))
        if "." not in bound:
            for param, fn, _ in _passed_to(index, bound, where):
                names.append((param, fn, False))
                names += [(attr, None, True) for attr in _kept_as(fn, param)]
    return names + _wrapped(index, names)


# iterables that yield the loader's batches (a progress bar, a counter), when bound to a name of their
# own: `train_bar = tqdm(train_loader)` then `for data, target in train_bar:` (SRGAN)
_WRAPPERS = frozenset({"tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.rich.tqdm",
                       "enumerate", "itertools.islice", "itertools.cycle"})


def _wrapped(index: SourceIndex, names: list[LoaderName]) -> list[LoaderName]:
    """The names bound to a wrapper of one of the loader's names (`bar = tqdm(enumerate(loader))`)."""
    def callee(node: ast.AST) -> str | None:
        if not isinstance(node, ast.Call) or not node.args:
            return None
        return index.qual(node.func) or (node.func.id if isinstance(node.func, ast.Name) else None)

    out: list[LoaderName] = []
    for n in index.nodes_of(ast.Assign):
        if not (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                and callee(n.value) in _WRAPPERS):
            continue
        inner = n.value.args[0]  # type: ignore[attr-defined]
        while callee(inner) in _WRAPPERS:
            inner = inner.args[0]
        scope = index.context(n)[0]
        if any(dotted(inner) == name and (anywhere or scope is sc) for name, sc, anywhere in names):
            out.append((n.targets[0].id, scope, False))
    return out


def _bound_by_callers(index: SourceIndex, dl_call: ast.Call, bound: str | None, scope: ast.AST | None
                      ) -> list[tuple[str, ast.AST | None]]:
    """Where the function `scope` returns the loader (the call itself, or its local name `bound`, alone
    or at a position of a returned tuple): the names the callers in this file bind the result to."""
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    at: set[int | None] = set()  # None: the whole result; i: item i of a returned tuple
    for node in walk_scope(scope.body):
        if isinstance(node, ast.Return) and node.value is not None:
            value = node.value
            items = value.elts if isinstance(value, ast.Tuple) else [value]
            for i, item in enumerate(items):
                if item is dl_call or bound is not None and "." not in bound and dotted(item) == bound:
                    at.add(i if isinstance(value, ast.Tuple) else None)
    if not at:
        return []
    out: list[tuple[str, ast.AST | None]] = []
    for call in index.calls_named(scope.name):
        parent = index.parents.get(call)
        if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1):
            continue
        target, where = parent.targets[0], index.context(call)[0]
        for pos in at:
            if pos is None and isinstance(target, (ast.Name, ast.Attribute)):
                name = dotted(target)
            elif pos is not None and isinstance(target, ast.Tuple) and pos < len(target.elts):
                name = dotted(target.elts[pos])
            else:
                name = None
            if name:
                out.append((name, where))
    return out


def _kept_as(fn: ast.AST, param: str) -> list[str]:
    """The attributes function `fn` keeps its parameter `param` in: `self.train_data = param`."""
    return [name for node in walk_scope(fn.body) if isinstance(node, ast.Assign)  # type: ignore[attr-defined]
            and isinstance(node.value, ast.Name) and node.value.id == param
            for t in node.targets if isinstance(t, ast.Attribute) and (name := dotted(t))]


def _iter_of(node: ast.AST, is_loader: Callable[[ast.AST, ast.AST], bool], where: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "iter"
            and len(node.args) == 1 and is_loader(node.args[0], where))


def batch_moves(index: SourceIndex, dl_call: ast.Call, loops: list[tuple[ast.AST, set[str]]] | None = None
                ) -> list[tuple[ast.Call, ast.AST]]:
    """(move, loop) for each `.cuda()` / `.to(device)` / `.type(<CUDA tensor type>)` of this
    loader's batches in the loops over it (`loops`, else `batch_loops`), and in a function of this file
    the loop hands them to (`loss = self.train_single_batch(user, item, rating)`, whose body moves
    its parameters with `users.cuda()`): one call deep, the loop is still the move's."""
    moves: list[tuple[ast.Call, ast.AST]] = []
    for loop, tracked in (batch_loops(index, dl_call) if loops is None else loops):
        body = _unshadowed(list(walk_scope(loop.body)), tracked)  # type: ignore[attr-defined]
        tracked |= _derived_names(index, body, tracked)
        moves += [(m, loop) for m in _moves_of(index, body, tracked)]
        for call in body:
            if isinstance(call, ast.Call):
                for fn, params in _handed_to(index, call, tracked):
                    inner = list(walk_scope(fn.body))
                    moves += [(m, loop) for m in _moves_of(index, inner, _derived_names(index, inner, params))]
    return moves


def _unshadowed(body: list[ast.AST], tracked: set[str]) -> list[ast.AST]:
    """`body` less the loops in it that bind a tracked name to the items of something else (HiFi-GAN's
    `for j, batch in enumerate(validation_loader):` every 1,000 steps inside `for i, batch in
    enumerate(train_loader):`): there the name is another loader's batch, not this one's."""
    inner = [n for n in body if isinstance(n, (ast.For, ast.AsyncFor))
             and {m.id for m in ast.walk(n.target) if isinstance(m, ast.Name)} & tracked
             and not {m.id for m in ast.walk(n.iter) if isinstance(m, ast.Name)} & tracked]
    if not inner:
        return body
    hidden = {id(m) for n in inner for m in walk_scope([*n.body, *n.orelse, n.target])}
    return [n for n in body if id(n) not in hidden]


def _moves_of(index: SourceIndex, body: list[ast.AST], tracked: set[str]) -> list[ast.Call]:
    """The moves in `body` of the names in `tracked`."""
    return [n for n in body if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and root_name(n.func.value) in tracked and _is_move(index, n)]


def _derived_names(index: SourceIndex, body: list[ast.AST], tracked: set[str]) -> set[str]:
    """`tracked` and the names `body` derives from them."""
    tracked = set(tracked)
    for _ in range(3):  # names derived from the batch: `x, y = batch`, `v` in `for k, v in batch.items()`
        for n in body:
            if isinstance(n, ast.Assign) and _derived(index, n.value, tracked):
                for t in n.targets:
                    tracked |= {m.id for m in ast.walk(t) if isinstance(m, ast.Name)}
            elif isinstance(n, ast.comprehension) and root_name(n.iter) in tracked:
                tracked |= {m.id for m in ast.walk(n.target) if isinstance(m, ast.Name)}
    return tracked


def _handed_to(index: SourceIndex, call: ast.Call, tracked: set[str]
               ) -> list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, set[str]]]:
    """The functions of this file named as `call` calls them (`step(x, y)`, `self.step(x, y)`), each with
    its parameters that receive a name derived from the batch (positionally, a method's `self` skipped,
    or by keyword). Names, or fixed parts of them (`_batch_part`): a call that computes its argument hands on
    something else."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else (
        call.func.id if isinstance(call.func, ast.Name) else None)
    if name is None or any(isinstance(a, ast.Starred) for a in call.args):
        return []
    out: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, set[str]]] = []
    for fn in index.nodes_of(ast.FunctionDef, ast.AsyncFunctionDef):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name != name:
            continue
        params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]
        got = {p for p in params if _batch_part(argument(call, fn, p, bound=isinstance(call.func, ast.Attribute)),
                                                tracked)}
        if got:
            out.append((fn, got))
    return out


def _batch_part(node: ast.expr | None, tracked: set[str]) -> bool:
    """A tracked name, or a fixed part of one (`data[0]`, `batch["image"]`: EmilienDupont/wgan-gp's
    `self._critic_train_iteration(data[0])`): the batch or a piece of it, not a value computed from it."""
    while isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        node = node.value
    return isinstance(node, ast.Name) and node.id in tracked


def drawn_moves(indexes: list[SourceIndex], facts: Facts, draws: dict[str, list[tuple[str, int]]]) -> None:
    """What the loops that drew a loader's batches do with them, where the run says which loops those
    were (`draws`: per loader subject key, the user lines that drew an epoch's first batch) and the
    static read of its construction found no move: a helper module builds the loader and returns it
    (`train_loader, test_loader = dataset.get(...)`), or a training function of another file takes it
    as a parameter (`def train(epoch, train_loader, model, ...)`), so no name links the two. Those
    loops are read as `batch_moves` reads the loops over a loader it can name; a move of their batches
    to CUDA (`input.cuda()` under `if torch.cuda.is_available():`, which a CPU run never executes)
    makes the loader `feeds_cuda`.

    And where no user file names `pin_memory` at all, no code sets it apart for the CUDA path: a loader
    built with `**kwargs`, whose CUDA-path value the source cannot otherwise say, gets `pin_memory_on_cuda`
    as the run saw it (a config file's value: the PD002 config sample's `"pin_memory": true`), else
    torch's default (False)."""
    by_file = {os.path.realpath(index.file): index for index in indexes}
    pin_named = any("pin_memory" in line for index in indexes for line in index.lines)
    for s in facts.of_kind("dataloader"):
        if not pin_named and "dataloader.pin_memory_on_cuda" not in s.facts and s.key in draws:
            # no file can set it apart for CUDA: the value the run saw (a config file's), else torch's default
            ran = s.facts.get("dataloader.pin_memory")
            put(s, "pin_memory_on_cuda", bool(ran.value) if ran is not None and ran.source == "run" else False)
        if "dataloader.feeds_cuda" in s.facts:
            continue
        moves: list[tuple[SourceIndex, ast.Call, ast.AST]] = []
        for file, line in draws.get(s.key, []):
            index = by_file.get(os.path.realpath(file))
            if index is not None:
                moves += [(index, m, loop) for m, loop in
                          batch_moves(index, None, _loops_drawing_at(index, line))]  # type: ignore[arg-type]
        if moves:
            put(s, "feeds_cuda", True)
            put(s, "non_blocking", all(
                isinstance(v := kwarg(m, "non_blocking"), ast.Constant) and v.value is True for _, m, _ in moves))
            pinned = s.facts.get("dataloader.pin_memory_on_cuda")
            trains = s.facts.get("dataloader.trains")  # the run's: its batches moved on most watched steps
            if pinned is not None and pinned.value is True and not (trains is not None and trains.value is False):
                for index, move, loop in moves:
                    pinned_copy(index, facts, move, loop)


def pinned_copy(index: SourceIndex, facts: Facts, move: ast.Call, loop: ast.AST) -> None:
    """The `batch_copy` subject (PD017) of a move of a pinned loader's batch, keyed on the move's line,
    with `non_blocking` as passed; none for a move in an evaluation loop beside the training loop (a loop
    with no training step where another loop of the file takes them, or, in a file with no training loop
    of a project that has one, a loop the source shows no training step runs: a `validation()` whose
    calls in its own file are all outside the steps, though the training script calls it every N steps):
    it is not on the training step."""
    loops = index.loops
    if not loops.trains(loop) and (loops.has_training_loop() or (
            loops.project_trains() and loops.in_training_step(loop) is False)):
        return
    nb = kwarg(move, "non_blocking")
    s = index.subject(facts, "batch_copy", move)
    put(s, "pinned", True)
    put(s, "non_blocking", isinstance(nb, ast.Constant) and nb.value is True)


def _loops_drawing_at(index: SourceIndex, line: int) -> list[tuple[ast.AST, set[str]]]:
    """The loops that draw a batch at `line`, each with the names the batch is bound to: a `for` whose
    header spans it (`for i, (x, y) in enumerate(loader):`), or the loop around a `batch = next(it)` there."""
    out: list[tuple[ast.AST, set[str]]] = []
    for loop in index.nodes_of(ast.For, ast.AsyncFor):
        if loop.lineno <= line <= (loop.iter.end_lineno or loop.lineno):
            out.append((loop, {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}))
    for n in index.nodes_of(ast.Assign):
        if not (isinstance(n, ast.Assign) and n.lineno <= line <= (n.end_lineno or n.lineno)
                and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name) and n.value.func.id == "next"):
            continue
        loop = index.loops.enclosing_loop(n)
        if loop is not None:
            out.append((loop, {m.id for t in n.targets for m in ast.walk(t) if isinstance(m, ast.Name)}))
    return out


def _is_move(index: SourceIndex, call: ast.Call) -> bool:
    """`x.to(device)`, `x.cuda()`, `x.type(Tensor)` with `Tensor` a CUDA tensor type on the GPU path."""
    attr = call.func.attr  # type: ignore[attr-defined]
    if attr in ("to", "cuda"):
        return index.devices.move_target(call) is not None
    return attr == "type" and len(call.args) == 1 and index.devices.cuda_tensor_type(call.args[0]) is not None


def _passed_to(index: SourceIndex, name: str, scope: ast.AST | None) -> list[tuple[str, ast.AST, bool]]:
    """(parameter, function, False) for each call in `scope` that passes `name` to a function of
    this file: `train(model, loader)` with `def train(model, train_loader)` -> "train_loader"."""
    out: list[tuple[str, ast.AST, bool]] = []
    defs: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
    for n in index.nodes:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defs.setdefault(n.name, []).append(n)
        elif isinstance(n, ast.ClassDef):  # `Trainer(model, loader)`: its __init__ takes it
            defs.setdefault(n.name, []).extend(
                b for b in n.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) and b.name == "__init__")
    for call in index.calls:
        if index.context(call)[0] is not scope:
            continue
        f = call.func
        fname = f.id if isinstance(f, ast.Name) else (f.attr if isinstance(f, ast.Attribute) else None)
        for fn in defs.get(fname, []) if fname else []:
            params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
            if (isinstance(f, ast.Attribute) or fn.name == "__init__") and params[:1] in (["self"], ["cls"]):
                params = params[1:]
            for i, a in enumerate(call.args):
                if isinstance(a, ast.Starred):
                    break
                if isinstance(a, ast.Name) and a.id == name and i < len(params):
                    out.append((params[i], fn, False))
            out += [(k.arg, fn, False) for k in call.keywords
                    if k.arg and isinstance(k.value, ast.Name) and k.value.id == name]
    return out


# what returns the batch itself, or the same data in another dtype or shape: `Variable(batch[0])` (an
# identity since torch 0.4), `x.float()`, `x.contiguous()`, `x.unsqueeze(1)`
_WRAPS_BATCH = frozenset({"torch.autograd.Variable", "torch.autograd.variable.Variable"})
_BATCH_METHODS = frozenset({"to", "cuda", "type", "values", "items", "float", "double", "half", "bfloat16",
                            "long", "int", "contiguous", "view", "reshape", "squeeze", "unsqueeze",
                            "permute", "transpose", "clone", "detach"})


def _derived(index: SourceIndex, value: ast.expr, tracked: set[str]) -> bool:
    """`batch`, `batch[0]`, `batch.x`, `(batch[0], batch[1])`, `x.to(d)`, `x.float()`,
    `Variable(batch[0])`: plain views of the batch."""
    if isinstance(value, (ast.Tuple, ast.List)):
        return bool(value.elts) and all(_derived(index, e, tracked) for e in value.elts)
    if isinstance(value, ast.Call):
        if index.qual(value.func) in _WRAPS_BATCH:
            return bool(value.args) and _derived(index, value.args[0], tracked)
        return (isinstance(value.func, ast.Attribute) and value.func.attr in _BATCH_METHODS
                and root_name(value.func.value) in tracked)
    return isinstance(value, (ast.Name, ast.Attribute, ast.Subscript)) and root_name(value) in tracked


def _given(call: ast.Call) -> dict[str, ast.expr]:
    """The DataLoader's arguments by name: keywords, and positionals unless a `*args` hides their order."""
    given: dict[str, ast.expr] = {k.arg: k.value for k in call.keywords if k.arg is not None}
    if not any(isinstance(a, ast.Starred) for a in call.args):
        for pname, value in zip(_POSITIONAL, call.args):
            given.setdefault(pname, value)
    return given


def pin_memory_on_cuda(index: SourceIndex, call: ast.Call) -> object:
    """pin_memory of this DataLoader call on a CUDA device (a bool, or UNKNOWN)."""
    return on_cuda_path(index, call, "pin_memory", False)


def on_cuda_path(index: SourceIndex, call: ast.Call, name: str, default: object) -> object:
    """The DataLoader argument `name` as it is when the script runs on a CUDA device: the argument as
    written, or what the `**kwargs` dicts put in it (`cuda_kwargs = {"num_workers": 1, "pin_memory":
    True}` merged in on the accelerator path), `default` where nothing sets it; UNKNOWN where the
    source does not say."""
    given = _given(call)
    star = has_star_kwargs(call) or any(isinstance(a, ast.Starred) for a in call.args)
    if name in given:
        arg = given[name]
        value = index.devices.on_cuda(arg)
        if value is UNKNOWN and isinstance(arg, ast.Name) and first_value(index, arg) is None:
            return _parameter_on_cuda(index, arg.id, call)
        return value
    dicts = [k.value for k in call.keywords if k.arg is None]
    if not star:
        return default
    if any(isinstance(a, ast.Starred) for a in call.args) or not all(isinstance(d, (ast.Name, ast.Dict)) for d in dicts):
        return UNKNOWN
    values = []
    for d in dicts:
        v = _dict_key_on_cuda(index, d, name, index.context(call)[0], 0)
        if v is UNKNOWN:
            return UNKNOWN
        if v is not None:
            values.append(v)
    return values[-1] if values else default


def _dict_key_on_cuda(index: SourceIndex, d: ast.expr, key: str, scope: ast.AST | None, depth: int) -> object:
    """`key` of the dict `d` on a CUDA device: its value, None where no path sets it, UNKNOWN where
    a contribution cannot be read (a dict built elsewhere, a guard the source does not decide)."""
    if depth > 3:
        return UNKNOWN
    if isinstance(d, ast.Dict):
        value: object = None
        for k, item in zip(d.keys, d.values):
            if k is None:
                sub = _dict_key_on_cuda(index, item, key, scope, depth + 1)
                if sub is UNKNOWN:
                    return UNKNOWN
                value = sub if sub is not None else value
            elif isinstance(k, ast.Constant) and k.value == key:
                value = index.devices.on_cuda(item)
                if value is UNKNOWN:
                    return UNKNOWN
        return value
    if isinstance(d, ast.IfExp):
        test = index.devices.on_cuda(d.test)
        return UNKNOWN if test is UNKNOWN else _dict_key_on_cuda(index, d.body if test else d.orelse, key, scope, depth + 1)
    if isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "dict" and not d.args:
        if has_star_kwargs(d):
            return UNKNOWN
        given = kwarg(d, key)
        return None if given is None else index.devices.on_cuda(given)
    if not isinstance(d, ast.Name):
        return UNKNOWN
    name = d.id
    found: object = None
    seen = False
    contributions: list[tuple[int, ast.AST, ast.expr | None]] = []  # (line, statement, dict or value)
    for node in index.nodes:
        if index.context(node)[0] is not scope:
            continue
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            contributions.append((node.lineno, node, node.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == name):
            if node.args:
                contributions.append((node.lineno, node, node.args[0]))
            if node.keywords:
                contributions.append((node.lineno, node, ast.Call(func=ast.Name("dict"), args=[], keywords=node.keywords)))
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(t := node.targets[0], ast.Subscript)
              and isinstance(t.value, ast.Name) and t.value.id == name):
            if isinstance(t.slice, ast.Constant) and t.slice.value == key:
                contributions.append((node.lineno, node, ast.Dict(keys=[t.slice], values=[node.value])))
    if not contributions:
        return UNKNOWN  # a parameter or a global built elsewhere
    for _, stmt, source in sorted(contributions, key=lambda c: c[0]):  # `nodes` is not in source order
        guard = _guard_on_cuda(index, stmt)
        if guard is False:
            continue
        got = _dict_key_on_cuda(index, source, key, scope, depth + 1) if source is not None else UNKNOWN
        if got is UNKNOWN or (guard is UNKNOWN and got is not None):
            return UNKNOWN
        if got is not None:
            found, seen = got, True
        elif isinstance(stmt, ast.Assign) and not isinstance(stmt.targets[0], ast.Subscript) and guard is True:
            found, seen = None, False  # rebinding the name to a dict without the key
    return found if seen else None


def _guard_on_cuda(index: SourceIndex, node: ast.AST) -> object:
    """Whether the `if`s around `node` (within its function) let it run on a CUDA device."""
    verdict: object = True
    child, parent = node, index.parents.get(node)
    while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        if isinstance(parent, ast.If):
            test = index.devices.on_cuda(parent.test)
            if test is not UNKNOWN:
                test = bool(test)
                taken = test if child in parent.body else (not test if child in parent.orelse else True)
                if not taken:
                    return False
            elif child in parent.body or child in parent.orelse:
                verdict = UNKNOWN
        child, parent = parent, index.parents.get(parent)
    return verdict
