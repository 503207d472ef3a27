"""Static evidence: an `ast` read of the user's files (never imported, never run).

It finds what a run on a CPU-only machine cannot show: a `.cuda()` path, a branch not taken,
a DataLoader that feeds a GPU. Every fact it adds has source "static". It is conservative:
a pattern it is not sure of is left out (a wrong finding costs more than a missed one).

Subjects use the contract's key `"<absolute file>:<line>"` (the line of the call or statement),
so that the run's probes and the static read of the same line merge into one subject.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path
from typing import Iterator

from perfdoctor.facts.model import Facts, Subject
from perfdoctor.model import Location

# torch factories that allocate on the CPU unless given `device=`. Left out on purpose:
# `from_numpy` (it has no `device=`, the data is on the host anyway) and the `*_like`
# factories (they take the device of their input, which may already be the GPU).
FACTORIES = frozenset({
    "randn", "rand", "randint", "randperm", "zeros", "ones", "full", "empty", "empty_strided",
    "arange", "linspace", "logspace", "eye", "tensor", "as_tensor",
})
DTYPE_NAMES = frozenset({
    "float", "float16", "half", "bfloat16", "float32", "float64", "double", "int", "int8", "int16",
    "int32", "int64", "long", "short", "uint8", "bool", "complex64", "complex128", "cfloat", "cdouble",
    "float8_e4m3fn", "float8_e5m2",
})
DATAPARALLEL = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                          "torch.nn.parallel.data_parallel.DataParallel"})
EMPTY_CACHE = frozenset({"torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"})
DATALOADER = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
# DataLoader's positional parameters, in order (torch 2.x).
_DL_POSITIONAL = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers",
                  "collate_fn", "pin_memory", "drop_last", "timeout", "worker_init_fn",
                  "multiprocessing_context", "generator")
# name: (type of a literal value, value when the argument is absent; None = leave the fact absent)
_DL_FACTS = {"num_workers": (int, 0), "pin_memory": (bool, False),
             "persistent_workers": (bool, False), "batch_size": (int, None)}
# identifiers that name a device: `device`, `self.device`, `dev`, `gpu`, `local_rank`, `rank`
_DEVICE_NAME = re.compile(r"device|(^|_)(dev|gpu|gpus|cuda|rank)(_|$)", re.I)
_CUDA_STRING = re.compile(r"^cuda(:\d+)?$")
_LIST_METHODS = frozenset({"append", "extend", "insert"})
_HOLDER_METHODS = frozenset({"update", "add", "record", "accumulate", "push", "put"})
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_DETAIL = "static read of the source"


def analyse_files(paths: list[Path], facts: Facts) -> None:
    """Add static subjects and facts for the user's files. Unreadable or unparsable files are skipped."""
    parsed = False
    targets_cuda = False
    for path in paths:
        source = _read(Path(path))
        if source is None:
            continue
        try:
            tree = ast.parse(source[0], filename=str(path))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        fa = FileAnalysis(Path(path).resolve(), source[1], tree, facts)
        fa.run()
        parsed = True
        targets_cuda = targets_cuda or fa.targets_cuda
    if parsed and "script.targets_cuda" not in facts:
        facts.add("script.targets_cuda", targets_cuda, source="static",
                  detail="the files name a CUDA device" if targets_cuda else "no CUDA device named in the files")


def _read(path: Path) -> tuple[bytes, list[str]] | None:
    """The file's bytes and its decoded lines (PEP 263 encoding), or None."""
    try:
        raw = path.read_bytes()
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        text = raw.decode(encoding)
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError):
        return None
    return raw, text.splitlines()


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


def _root_name(node: ast.AST) -> str | None:
    """The name at the root of `x`, `x[0]`, `x.a`, `x.float()`, `x["k"].to(d)` receivers."""
    while True:
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value
        else:
            return node.id if isinstance(node, ast.Name) else None


def _bare_names(node: ast.AST) -> Iterator[ast.Name]:
    """Names reached through arithmetic, tuples and lists only (not inside calls or attributes)."""
    if isinstance(node, ast.Name):
        yield node
    elif isinstance(node, ast.BinOp):
        yield from _bare_names(node.left)
        yield from _bare_names(node.right)
    elif isinstance(node, ast.UnaryOp):
        yield from _bare_names(node.operand)
    elif isinstance(node, (ast.Tuple, ast.List)):
        for e in node.elts:
            yield from _bare_names(e)


def _walk_scope(nodes: list[ast.AST]) -> Iterator[ast.AST]:
    """All nodes under `nodes`, not entering nested functions, lambdas or classes."""
    stack = list(reversed(nodes))
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (*_SCOPES, ast.ClassDef)):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(n))))


def _kwarg(call: ast.Call, name: str) -> ast.expr | None:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def _has_star_kwargs(call: ast.Call) -> bool:
    return any(k.arg is None for k in call.keywords)


class FileAnalysis:
    """One parsed file: import aliases, loop context, and the pattern finders."""

    def __init__(self, file: Path, tree_source: list[str], tree: ast.Module, facts: Facts):
        self.file = str(file)
        self.lines = tree_source
        self.tree = tree
        self.facts = facts
        self.targets_cuda = False
        self.parents: dict[ast.AST, ast.AST] = {}
        # node -> (enclosing function or None, directly in a for/while body of that function)
        self.ctx: dict[ast.AST, tuple[ast.AST | None, bool]] = {tree: (None, False)}
        stack: list[ast.AST] = [tree]
        self.nodes: list[ast.AST] = []  # every node, parents before children
        while stack:
            node = stack.pop()
            self.nodes.append(node)
            scope, in_loop = self.ctx[node]
            if isinstance(node, _SCOPES):
                scope, in_loop = node, False
            body = {id(b) for b in node.body} if isinstance(node, _LOOPS) else ()
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
                self.ctx[child] = (scope, in_loop or id(child) in body)
                stack.append(child)
        self.aliases = self._aliases()
        # simple `name = value` assignments, for telling devices from dtypes
        self.assigned: dict[str, list[ast.expr]] = {}
        for node in self.nodes:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.assigned.setdefault(t.id, []).append(node.value)
        self.called_in_loop = {n for n in self._calls_in_loops()}

    # -- helpers -------------------------------------------------------------------------
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

    def context(self, node: ast.AST) -> tuple[ast.AST | None, bool]:
        """(enclosing function or None, directly inside a for/while body of that function)."""
        return self.ctx.get(node, (None, False))

    def in_loop(self, node: ast.AST) -> bool:
        """In a loop body, or in a function of this file that a loop body calls (one level)."""
        scope, direct = self.context(node)
        return direct or (isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef))
                          and scope.name in self.called_in_loop)

    def _calls_in_loops(self) -> Iterator[str]:
        for node in self.nodes:
            if isinstance(node, ast.Call) and self.context(node)[1]:
                f = node.func
                if isinstance(f, ast.Name):
                    yield f.id
                elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in ("self", "cls"):
                    yield f.attr

    def function_name(self, node: ast.AST) -> str:
        scope, _ = self.context(node)
        if scope is None:
            return "<module>"
        return "<lambda>" if isinstance(scope, ast.Lambda) else scope.name

    def text(self, node: ast.AST) -> str:
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

    def subject(self, kind: str, node: ast.AST) -> Subject:
        line = node.lineno
        s = self.facts.subject(kind, f"{self.file}:{line}")
        self.locate(s, node)
        return s

    def locate(self, s: Subject, node: ast.AST) -> None:
        line = node.lineno
        if not any(loc.file == self.file and loc.line == line for loc in s.locations):
            code = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
            s.locations.append(Location(self.file, line, code, self.function_name(node)))

    @staticmethod
    def put(s: Subject, name: str, value, unit: str = "") -> None:
        """Add a static fact unless another source already set it."""
        full = name if name.startswith(s.kind + ".") else f"{s.kind}.{name}"
        if full not in s.facts:
            s.add(full, value, unit=unit, source="static", detail=_DETAIL)

    def is_dtype(self, node: ast.AST) -> bool:
        q = self.qual(node)
        if q and q.startswith("torch.") and q[6:] in DTYPE_NAMES:
            return True
        if isinstance(node, ast.Name):
            return any(self.is_dtype(v) for v in self.assigned.get(node.id, []))
        return False

    def device_expr(self, node: ast.AST) -> bool | None:
        """True: names a (possibly CUDA) device. False: names the CPU. None: not a device / unsure."""
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
            branches = [self.device_expr(node.body), self.device_expr(node.orelse)]
            return True if True in branches else (False if branches == [False, False] else None)
        if isinstance(node, ast.Call):
            if self.qual(node.func) == "torch.device":
                return self.device_expr(node.args[0]) if node.args else None
            return None
        name = dotted(node)
        if name is None or self.is_dtype(node):
            return None
        if isinstance(node, ast.Name) and node.id in self.assigned:
            verdicts = {self.device_expr(v) for v in self.assigned[node.id]}
            if verdicts == {False}:
                return False
            if True in verdicts:
                return True
        last = name.rsplit(".", 1)[-1]
        return True if _DEVICE_NAME.search(last) else None

    def move_target(self, call: ast.Call) -> str | None:
        """For `recv.cuda(...)` / `recv.to(...)`: the device's source text when it moves to a
        (possibly CUDA) device; None for dtype-only casts, CPU targets and anything unsure."""
        f = call.func
        if not isinstance(f, ast.Attribute):
            return None
        if f.attr == "cuda":
            dev = call.args[0] if call.args else _kwarg(call, "device")
            return "cuda" if dev is None else self.text(dev)
        if f.attr != "to":
            return None
        dev = _kwarg(call, "device")
        if dev is None and call.args:
            dev = call.args[0]
        if dev is None or self.device_expr(dev) is not True:
            return None
        return self.text(dev)

    def factory(self, node: ast.AST) -> str | None:
        """The factory name when `node` is a CPU factory call (no `device=`, no `**kwargs`)."""
        if not isinstance(node, ast.Call):
            return None
        q = self.qual(node.func)
        if not q or not q.startswith("torch.") or q[6:] not in FACTORIES:
            return None
        if any(_kwarg(node, k) is not None for k in ("device", "generator")) or _has_star_kwargs(node):
            return None  # a CPU generator cannot make a tensor on another device
        return q[6:]

    # -- the patterns --------------------------------------------------------------------
    def run(self) -> None:
        for node in self.nodes:
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _CUDA_STRING.match(node.value):
                self.targets_cuda = True
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr == "cuda":
                self.targets_cuda = True
            q = self.qual(node.func)
            if q in DATAPARALLEL:
                self.put(self.subject("dataparallel", node), "callee", self.text(node.func))
            elif q in EMPTY_CACHE:
                self.put(self.subject("empty_cache", node), "in_loop", self.in_loop(node))
            elif q in DATALOADER:
                self.dataloader(node)
            self.cpu_to_device_chained(node)
        self.cpu_to_device_two_statements()
        for node in self.nodes:
            if isinstance(node, _LOOPS):
                self.loss_holders(node)

    def cpu_to_device_chained(self, call: ast.Call) -> None:
        """`torch.randn(...).cuda()`, `torch.zeros(...).to(device)`."""
        if not isinstance(call.func, ast.Attribute):
            return
        fac = self.factory(call.func.value)
        target = self.move_target(call) if fac else None
        if target is None:
            return
        s = self.subject("cpu_to_device", call)
        self.put(s, "factory", fac)
        self.put(s, "target", target)
        self.put(s, "in_loop", self.in_loop(call))

    def cpu_to_device_two_statements(self) -> None:
        """`x = torch.randn(...)` then, a few statements later, `x = x.to(device)` / `x = x.cuda()`."""
        for block in _blocks(self.nodes):
            for i, stmt in enumerate(block):
                if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                        and isinstance(stmt.targets[0], ast.Name)):
                    continue
                fac = self.factory(stmt.value)
                if fac is None:
                    continue
                name = stmt.targets[0].id
                between: set[str] = set()  # names assigned between the two statements
                for later in block[i + 1:i + 6]:
                    move = self._rebind_move(later, name)
                    if move is not None:
                        target = self.move_target(move)
                        dev_names = {n.id for n in ast.walk(move) if isinstance(n, ast.Name)} - {name}
                        if target is not None and not dev_names & between:
                            s = self.subject("cpu_to_device", stmt)
                            self.locate(s, later)
                            self.put(s, "factory", fac)
                            self.put(s, "target", target)
                            self.put(s, "in_loop", self.in_loop(stmt))
                        break
                    if isinstance(later, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.Return,
                                          ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or any(
                            isinstance(n, ast.Name) and n.id == name for n in ast.walk(later)):
                        break
                    between |= {n.id for n in ast.walk(later) if isinstance(n, ast.Name)
                                and isinstance(n.ctx, ast.Store)}

    @staticmethod
    def _rebind_move(stmt: ast.stmt, name: str) -> ast.Call | None:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and stmt.targets[0].id == name and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr in ("to", "cuda")
                and isinstance(stmt.value.func.value, ast.Name) and stmt.value.func.value.id == name):
            return stmt.value
        return None

    def dataloader(self, call: ast.Call) -> None:
        s = self.subject("dataloader", call)
        star_kw = _has_star_kwargs(call)
        explicit_kw = any(k.arg is not None for k in call.keywords)
        style = "literal" if not star_kw else ("mixed" if explicit_kw else "dict")
        self.put(s, "kwargs_style", style)
        given: dict[str, ast.expr] = {k.arg: k.value for k in call.keywords if k.arg is not None}
        star_args = any(isinstance(a, ast.Starred) for a in call.args)
        if not star_args:
            for pname, value in zip(_DL_POSITIONAL, call.args):
                given.setdefault(pname, value)
        for name, (typ, default) in _DL_FACTS.items():
            if name in given:
                try:
                    value = ast.literal_eval(given[name])
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
                if type(value) is typ:
                    self.put(s, name, value, "count" if typ is int else "")
            elif default is not None and not star_kw and not star_args:
                self.put(s, name, default, "count" if typ is int else "")
        moves = self.batch_moves(call)
        if moves:
            self.put(s, "feeds_cuda", True)
            self.put(s, "non_blocking", all(
                isinstance(v := _kwarg(m, "non_blocking"), ast.Constant) and v.value is True for m in moves))

    def batch_moves(self, dl_call: ast.Call) -> list[ast.Call]:
        """`.cuda()` / `.to(device)` calls on the batches of `for ... in <this loader>` loops: in the
        scope that names the loader, and in a function of this file it is passed to (one level)."""
        parent = self.parents.get(dl_call)
        names: list[tuple[str, ast.AST | None, bool]] = []  # (name, scope, any scope)
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(
                parent.targets[0], (ast.Name, ast.Attribute)):
            bound = dotted(parent.targets[0])
            scope = self.context(dl_call)[0]
            if bound:
                names.append((bound, scope, "." in bound or scope is None))
                if "." not in bound:
                    names += self._passed_to(bound, scope)
        moves: list[ast.Call] = []
        for loop in self.nodes:
            if not isinstance(loop, (ast.For, ast.AsyncFor)):
                continue
            it = loop.iter  # `loader`, `enumerate(loader)`, `tqdm(loader)`, `zip(...)` or the call itself
            candidates = [it] + (list(it.args) if isinstance(it, ast.Call) and it is not dl_call else [])
            loop_scope = self.context(loop)[0]
            if not any(c is dl_call or any(dotted(c) == name and (anywhere or loop_scope is scope)
                                           for name, scope, anywhere in names) for c in candidates):
                continue
            tracked = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
            body = list(_walk_scope(loop.body))
            for _ in range(3):  # names derived from the batch: `x, y = batch`, `v` in `for k, v in batch.items()`
                for n in body:
                    if isinstance(n, ast.Assign) and _derived(n.value, tracked):
                        for t in n.targets:
                            tracked |= {m.id for m in ast.walk(t) if isinstance(m, ast.Name)}
                    elif isinstance(n, ast.comprehension) and _root_name(n.iter) in tracked:
                        tracked |= {m.id for m in ast.walk(n.target) if isinstance(m, ast.Name)}
            for n in body:
                if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("to", "cuda")
                        and _root_name(n.func.value) in tracked and self.move_target(n) is not None):
                    moves.append(n)
        return moves

    def _passed_to(self, name: str, scope: ast.AST | None) -> list[tuple[str, ast.AST, bool]]:
        """(parameter, function, False) for each call in `scope` that passes `name` to a function of
        this file: `train(model, loader)` with `def train(model, train_loader)` -> "train_loader"."""
        out: list[tuple[str, ast.AST, bool]] = []
        defs: dict[str, list[ast.AST]] = {}
        for n in self.nodes:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.setdefault(n.name, []).append(n)
        for call in self.nodes:
            if not isinstance(call, ast.Call) or self.context(call)[0] is not scope:
                continue
            f = call.func
            fname = f.id if isinstance(f, ast.Name) else (f.attr if isinstance(f, ast.Attribute) else None)
            for fn in defs.get(fname, []) if fname else []:
                params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
                if isinstance(f, ast.Attribute) and params[:1] in (["self"], ["cls"]):
                    params = params[1:]
                for i, a in enumerate(call.args):
                    if isinstance(a, ast.Starred):
                        break
                    if isinstance(a, ast.Name) and a.id == name and i < len(params):
                        out.append((params[i], fn, False))
                out += [(k.arg, fn, False) for k in call.keywords
                        if k.arg and isinstance(k.value, ast.Name) and k.value.id == name]
        return out

    def loss_holders(self, loop: ast.AST) -> None:
        body = list(_walk_scope(loop.body))
        assigns: dict[str, list[int]] = {}  # name -> lines where the loop (re)binds it
        backward: list[tuple[str, int]] = []  # (name, line) of what is `.backward()`-ed
        for n in body:
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                    for m in ast.walk(t):
                        if isinstance(m, ast.Name):
                            assigns.setdefault(m.id, []).append(n.lineno)
            elif isinstance(n, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
                for t in ([n.target] if isinstance(n, (ast.For, ast.AsyncFor)) else
                          [i.optional_vars for i in n.items if i.optional_vars is not None]):
                    for m in ast.walk(t):
                        if isinstance(m, ast.Name):
                            assigns.setdefault(m.id, []).append(n.lineno)
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward":
                src = n.args[0] if n.args else n.func.value
                for m in ast.walk(src):
                    if isinstance(m, ast.Name):
                        backward.append((m.id, n.lineno))

        def last_bind(name: str, line: int) -> int | None:
            before = [ln for ln in assigns.get(name, []) if ln < line]
            return max(before) if before else None

        losses = {(name, last_bind(name, line)) for name, line in backward if last_bind(name, line) is not None}
        for n in body:
            found = self._holder(n)
            if found is None:
                continue
            kind, holder_node, refs = found
            for ref in refs:
                if (ref.id, last_bind(ref.id, n.lineno)) in losses and _root_name(holder_node) != ref.id:
                    holder = self.text(holder_node)
                    s = self.subject("loss_holder", n)
                    self.put(s, "kind", kind)
                    self.put(s, "holder", holder)
                    self.put(s, "tensor_name", ref.id)
                    break

    def _holder(self, n: ast.AST) -> tuple[str, ast.expr, list[ast.Name]] | None:
        """(kind, holder node, bare names it takes) for `X.append(a)`, `X += a`, `X = X + a`, `m.update(a)`."""
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute):
            call = n.value
            attr = call.func.attr
            if attr in _LIST_METHODS:
                kind = "list"
            elif attr == "add_":
                kind = "running-sum"
            elif attr in _HOLDER_METHODS:
                kind = "attribute"
            else:
                return None
            refs = [m for a in call.args for m in _bare_names(a)]
            return kind, call.func.value, refs
        if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add):
            return "running-sum", n.target, list(_bare_names(n.value))
        if (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.value, ast.BinOp)
                and isinstance(n.value.op, ast.Add)):
            target = dotted(n.targets[0])
            leaves = list(_bare_names(n.value))
            if target and "." not in target and any(m.id == target for m in leaves):
                return "running-sum", n.targets[0], [m for m in leaves if m.id != target]
        return None


def _derived(value: ast.expr, tracked: set[str]) -> bool:
    """`batch`, `batch[0]`, `batch.x`, `(batch[0], batch[1])`, `x.to(d)`: plain views of the batch."""
    if isinstance(value, (ast.Tuple, ast.List)):
        return bool(value.elts) and all(_derived(e, tracked) for e in value.elts)
    if isinstance(value, ast.Call):
        return (isinstance(value.func, ast.Attribute) and value.func.attr in ("to", "cuda", "values", "items")
                and _root_name(value.func.value) in tracked)
    return isinstance(value, (ast.Name, ast.Attribute, ast.Subscript)) and _root_name(value) in tracked


def _blocks(nodes: list[ast.AST]) -> Iterator[list[ast.stmt]]:
    for node in nodes:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block
