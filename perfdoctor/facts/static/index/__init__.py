"""The source index: one user file read and parsed once, for every detector, in four parts by knowledge.

`read(path)` reads the file (`contracts.source`: regular files only, capped, once per analysis),
decodes it (PEP 263) and parses it; a `SourceIndex` is then:

- its syntax and names (`syntax.Syntax`, which `SourceIndex` is): nodes, parents, scopes, import
  aliases, assignments, functions and their callers, source text, and the node helpers;
- `index.loops` (`loops.Loops`): the training step, the loops that take it, how often a node runs;
- `index.devices` (`devices.Devices`): devices, dtypes and the value of an expression on a CUDA device;
- `index.frameworks` (`frameworks.Frameworks`): Lightning and Accelerate as the file builds them;

each part built on first use and reading the file only through `Syntax`. `SourceIndex` also knows
which of the file's model classes a run called (`model_ran`) and makes and locates the subjects the
detectors report, with the contract's key `"<absolute file>:<line>"` (`subject`, `locate`); `put` and
`add_union` add the static facts. The rule fixes (`perfdoctor/rules/fixes/context.py`) build the same
index over the file they rewrite, so a fix reads names, devices and dtypes exactly as the finding did.
"""

from __future__ import annotations

import ast
from functools import cached_property
from pathlib import Path
from typing import Any

from perfdoctor.contracts.source import read_source
from perfdoctor.facts.model import Facts, Subject
from perfdoctor.facts.static.index.devices import Devices
from perfdoctor.facts.static.index.frameworks import Frameworks
from perfdoctor.facts.static.index.loops import Loops
from perfdoctor.facts.static.index.syntax import Located, Syntax, dotted
from perfdoctor.model import Location

_DETAIL = "static read of the source"


def read(path: Path, imported: bool = False) -> SourceIndex | None:
    """The index of one file, or None when it cannot be read (`contracts.source`: regular files only,
    capped; the run folder names these files), decoded or parsed. `imported`: the run imported this
    file as a module (it was not the script the run started), so its `if __name__ == "__main__":`
    blocks never ran: they are left out of the index (a model file's self-test, with its own
    `loss.backward()` in a loop and `.numpy()` reads, is not the training loop)."""
    sf = read_source(path)
    tree = sf.parse(str(path)) if sf is not None and sf.encoding is not None else None
    if sf is None or tree is None:
        return None
    if imported:
        tree.body = [kept for stmt in tree.body for kept in _unless_main(stmt)]
    return SourceIndex(path.resolve(), sf.lines, tree)


def _unless_main(stmt: ast.stmt) -> list[ast.stmt]:
    """A module-level statement as an imported module runs it: `if __name__ == "__main__":` runs only
    its `else` branch (nothing without one); every other statement as it is."""
    if (isinstance(stmt, ast.If) and isinstance(test := stmt.test, ast.Compare)
            and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__"):
        return list(stmt.orelse)
    return [stmt]


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


class SourceIndex(Syntax):
    """One parsed file: its syntax and names, and its loops, devices and frameworks parts."""

    def __init__(self, file: Path, lines: list[str], tree: ast.Module):
        super().__init__(file, lines, tree)
        # the qualnames of this file's classes that were part of the models a run called, where a
        # run says (set by `static.analyse_files`); None: unknown
        self.ran_classes: set[str] | None = None
        # the lines of this file where a run saw a torch factory make a host tensor in the steps it
        # watched (set by `static.analyse_files`); None: no run says
        self.factories_ran: frozenset[int] | None = None
        # the lines of this file that moved a tensor to a device (`.to(device)`, `.cuda()`, `.type_as()`)
        # in the steps the run's host-tensor probe watched (set by `static.analyse_files`); None: no run says
        self.moves_ran: frozenset[int] | None = None
        # the first lines of this file's functions the run's profiled steps called, and the lines of the
        # step's call chain in this file (set by `static.analyse_files`); None: no run says
        self.functions_called: frozenset[int] | None = None
        self.chain_lines: frozenset[int] = frozenset()

    @cached_property
    def loops(self) -> Loops:
        return Loops(self)

    @cached_property
    def devices(self) -> Devices:
        return Devices(self)

    @cached_property
    def frameworks(self) -> Frameworks:
        return Frameworks(self)

    def model_ran(self, node: ast.AST) -> bool:
        """False where `node` is inside a class of this file that the run's models did not hold
        (a model the script defines or imports but never called) and none of whose methods the run
        saw call in its profiled steps (`functions_called`: a CRF whose methods the model's loss
        method calls directly); True
        inside one they held, outside any class, or where no run says which classes ran."""
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
        return ".".join(reversed(names)) in self.ran_classes or any(
            isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and self.called(n) for n in cls.body)

    def called(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        """The run's profiled steps called `fn` (`functions_called`: cProfile's first line of it, the
        `def` or a decorator's); False where no run says."""
        return bool({fn.lineno, *(d.lineno for d in fn.decorator_list)} & (self.functions_called or frozenset()))

    def module_ran(self, node: ast.AST) -> bool:
        """`model_ran`, judged only inside an `nn.Module` class (one with a `forward`, or a base from
        torch.nn, named `...Module`, or such a class of this file): the run's module trees say
        nothing of other classes (a trainer, a sampler)."""
        cls = next((p for p in self.ancestors(node) if isinstance(p, ast.ClassDef)), None)
        return cls is None or not self._module_class(cls, 0) or self.model_ran(node)

    def _module_class(self, cls: ast.ClassDef, depth: int) -> bool:
        if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "forward" for n in cls.body):
            return True
        for b in cls.bases:
            name = self.qual(b) or dotted(b) or ""
            if name.startswith("torch.nn.") or name.endswith("Module"):
                return True
            local = next((c for c in self.nodes_of(ast.ClassDef) if isinstance(c, ast.ClassDef) and c.name == name), None)
            if local is not None and local is not cls and depth < 8 and self._module_class(local, depth + 1):
                return True
        return False

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
