"""Syntax and names: one parsed file walked once, and what every detector asks of its shape.

Every node (parents before children, `nodes`, `nodes_of` by type) and its parent (`parents`,
`ancestors`), the enclosing function of each node and whether it sits directly in a loop's body
(`context`, `function_name`), the statement each node is part of (`anchors`), the file's import
aliases (`qual` turns `nn.DataParallel` into `torch.nn.DataParallel`), simple `name = value`
assignments (`assigned`), the file's functions by name and the calls that may reach them
(`local_callee`, `callers`, `calls_named`, `bound_calls`), and a node's source text (`text`); with
the helpers on single nodes (`dotted`, `root_name`, `walk_scope`, `kwarg`, `has_star_kwargs`).
The other parts of the index (`loops`, `devices`, `frameworks`) read the file through this one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from perfdoctor.contracts.source import read_source

LOOPS = (ast.For, ast.AsyncFor, ast.While)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
Scope = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda  # the enclosing function of a node
Located = ast.stmt | ast.expr  # a node with a position in the source


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
        if isinstance(n, (*SCOPES, ast.ClassDef)):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(n))))


def kwarg(call: ast.Call, name: str) -> ast.expr | None:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def argument(call: ast.Call, fn: ast.FunctionDef | ast.AsyncFunctionDef, param: str, bound: bool) -> ast.expr | None:
    """What `call` passes for the parameter `param` of `fn`: by keyword, else by position (`bound`: a
    method called on its object, whose first parameter `self`/`cls` the call does not pass); None where
    it passes nothing for it, or a starred argument comes before it."""
    v = kwarg(call, param)
    if v is not None:
        return v
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if param not in params:
        return None
    i = params.index(param) - (1 if bound and params[0] in ("self", "cls") else 0)
    if not 0 <= i < len(call.args) or any(isinstance(a, ast.Starred) for a in call.args[:i + 1]):
        return None
    return call.args[i]


def called_name(call: ast.Call) -> str | None:
    """The name a call calls by: `f` of `f(...)` and of `x.f(...)`; None for any other callee."""
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def has_star_kwargs(call: ast.Call) -> bool:
    return any(k.arg is None for k in call.keywords)


def _module_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs at import time: its top level and the if/try blocks there."""
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try)):
            stack.extend([*node.body, *node.orelse, *getattr(node, "finalbody", [])])
            stack.extend(s for h in getattr(node, "handlers", []) for s in h.body)


def star_aliases(folder: Path, module: str | None, level: int = 0, depth: int = 0) -> dict[str, str]:
    """The import aliases `from module import *` brings into a file of `folder`, where `module` is a
    file of the same project (found beside the file or up to two folders above it, as a script run
    from its project's root imports it): the names that module binds by its own imports (star
    imports of its own followed twice more), public ones only, and only those its `__all__` lists
    when it has one. Nothing for a module outside the project (an installed package)."""
    if depth > 2 or (not module and not level):
        return {}
    parts = module.split(".") if module else []
    if level:
        bases = [folder.parents[level - 2] if level > 1 else folder] if level - 1 <= len(folder.parents) else []
    else:
        bases = [folder, *list(folder.parents)[:2]]
    for base in bases:
        files = [base.joinpath(*parts).with_suffix(".py")] if parts else []
        for candidate in [*files, base.joinpath(*parts, "__init__.py")]:
            # read as every user file is (contracts.source: a regular file, capped, decoded by PEP 263)
            sf = read_source(candidate)
            if sf is None:
                continue
            tree = sf.parse(str(candidate)) if sf.encoding is not None else None
            if tree is None:
                return {}
            exported: set[str] | None = None
            for node in tree.body:
                if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                        and isinstance(node.value, (ast.List, ast.Tuple))):
                    exported = {e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            found: dict[str, str] = {}
            for node in _module_imports(tree):
                if isinstance(node, ast.Import):
                    for a in node.names:
                        found[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                elif node.module and not node.level:
                    for a in node.names:
                        if a.name == "*":
                            for name, target in star_aliases(candidate.parent, node.module, 0, depth + 1).items():
                                found.setdefault(name, target)
                        else:
                            found[a.asname or a.name] = f"{node.module}.{a.name}"
                elif any(a.name == "*" for a in node.names):
                    found.update({k: v for k, v in star_aliases(candidate.parent, node.module, node.level, depth + 1).items()
                                  if k not in found})
            return {name: target for name, target in found.items()
                    if not name.startswith("_") and (exported is None or name in exported)}
    return {}


class Syntax:
    """One parsed file: its nodes, parents, scopes, import aliases, assignments, functions and text."""

    def __init__(self, file: Path, lines: list[str], tree: ast.Module):
        self.file = str(file)
        self.lines = lines
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        # node -> (enclosing function or None, directly in a for/while body of that function)
        self.ctx: dict[ast.AST, tuple[Scope | None, bool]] = {tree: (None, False)}
        # node -> the statement (or lambda) it is part of: loops and ifs are statements, so the walks up
        # to them (`Loops.enclosing_loop`, `Loops.periodic`) start there, not at each level of a deep expression
        self.anchors: dict[ast.AST, ast.AST] = {tree: tree}
        stack: list[ast.AST] = [tree]
        self.nodes: list[ast.AST] = []  # every node, parents before children
        while stack:
            node = stack.pop()
            self.nodes.append(node)
            scope, in_loop = self.ctx[node]
            if isinstance(node, SCOPES):
                scope, in_loop = node, False
            body = {id(b) for b in node.body} if isinstance(node, LOOPS) else ()
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
                self.ctx[child] = (scope, in_loop or id(child) in body)
                self.anchors[child] = child if isinstance(child, (ast.stmt, ast.Lambda)) else self.anchors[node]
                stack.append(child)
        self._by_type: dict[type, list[ast.AST]] = {}  # `nodes_of`
        for node in self.nodes:
            self._by_type.setdefault(type(node), []).append(node)
        self.calls: list[ast.Call] = self.nodes_of(ast.Call)
        self.aliases = self._aliases()
        # simple `name = value` assignments, for telling devices from dtypes; and the values a tuple
        # unpacking binds a name from (`s, a, r = memory.sample(n)`: each name a part of that value)
        self.assigned: dict[str, list[ast.expr]] = {}
        self.unpacked: dict[str, list[ast.expr]] = {}
        for node in self.nodes:
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        self.assigned.setdefault(t.id, []).append(node.value)
                    elif isinstance(t, (ast.Tuple, ast.List)):
                        for e in t.elts:
                            if isinstance(e, ast.Name):
                                self.unpacked.setdefault(e.id, []).append(node.value)
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        for node in self.nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, []).append(node)
        self._callers: dict[str, list[ast.Call]] | None = None  # function name -> its calls in this file
        self._named: dict[str, list[ast.Call]] | None = None  # `calls_named`

    def nodes_of(self, *types: type) -> list[Any]:
        """The nodes of these exact AST types, parents before children within a type: what a detector
        asks of every loader or call looks at these, not at every node of a long file again."""
        if len(types) == 1:
            return list(self._by_type.get(types[0], []))
        return [n for n in self.nodes if type(n) in types]

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        """The nodes around `node`, innermost first, up to the module."""
        p = self.parents.get(node)
        while p is not None:
            yield p
            p = self.parents.get(p)

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
        # `from modeling.deeplab import *` of a module of the same project brings that module's own
        # imports (`torch`, `nn`) unless its __all__ leaves them out: a file with no `import torch`
        # of its own still means torch by `torch.no_grad()` (jfzhang95/pytorch-deeplab-xception)
        for node in self.nodes_of(ast.ImportFrom):
            if any(a.name == "*" for a in node.names):
                for name, target in star_aliases(Path(self.file).parent, node.module, node.level).items():
                    aliases.setdefault(name, target)
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
                if (called := called_name(c)) is not None:
                    self._named.setdefault(called, []).append(c)
        return list(self._named.get(name, []))

    def bound_calls(self, node: ast.AST) -> list[ast.Call]:
        """The calls `node` stands for: itself where it is a call, else the calls this file assigns
        to its dotted name (`trainer = L.Trainer(...)`, `self.accelerator = Accelerator(...)`)."""
        if isinstance(node, ast.Call):
            return [node]
        name = dotted(node)
        return [] if name is None else [
            n.value for n in self.nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and any(dotted(t) == name for t in n.targets)]
