"""torch.optim constructions (PD021): one `optimizer` subject per call, with the class and the
`foreach` / `fused` arguments where they are given as literals (absent: torch's default, which on
CUDA is foreach). Not one built inside an `nn.Module` class the run's models never held and none of
whose methods its steps called (`SourceIndex.module_ran`: an algorithm class of a library of them, each
building its own optimizer, beside the one the run trains): the run never built it.

Also the construction of an optimizer of another class, a hand-written one (BertAdam, a RAdam of the
repository's own): a call of a class not of torch whose first argument (or `params=`) is parameters
(`model.parameters()`, `optimizer_grouped_parameters`; not a builtin's call nor a class's own
`__init__`), with `optimizer.name` its class name and `optimizer.custom` True; or such a call through a
variable that holds a class (`optim_class(model.parameters(), ...)`, where a factory picked it), named
`optim...` or assigned to a name `optim...` (`optimizer.through_variable`). Whether it loops over its parameters is the trace's to say
(facts/trace/optimizer_loop.py, by the class of the step it saw)."""

from __future__ import annotations

import ast
import builtins

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.syntax import dotted, kwarg

BUILTINS = frozenset(dir(builtins))
# the optimizers of torch.optim that take `foreach`
OPTIMIZERS = frozenset({"Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "ASGD", "NAdam", "RAdam",
                        "RMSprop", "Rprop", "SGD"})


def detect(index: SourceIndex, facts: Facts) -> None:
    for call in index.calls:
        q = index.qual(call.func) or ""
        mod, _, cls = q.rpartition(".")
        if mod not in ("torch.optim", f"torch.optim.{cls.lower()}") or cls not in OPTIMIZERS:
            _custom(index, facts, call, q)
            continue
        if not index.module_ran(call):
            continue
        s = index.subject(facts, "optimizer", call)
        put(s, "name", cls)
        for arg in ("foreach", "fused"):
            v = kwarg(call, arg)
            if isinstance(v, ast.Constant) and isinstance(v.value, bool):
                put(s, arg, v.value)


def _custom(index: SourceIndex, facts: Facts, call: ast.Call, q: str) -> None:
    """A construction of an optimizer class not of torch (see the module's doc)."""
    f = call.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    if name is None or q.startswith("torch.") or q == "torch":
        return
    params = call.args[0] if call.args and not isinstance(call.args[0], ast.Starred) else kwarg(call, "params")
    if params is None or not _parameters(index, params):
        return
    through = name[:1].islower()
    if not through and not name[:1].isupper():
        return  # `super().__init__(params, defaults)`: a class's own constructor
    if through:
        if isinstance(f, ast.Name) and f.id in BUILTINS:
            return  # `list(model.parameters())`
        parent = index.parents.get(call)
        target = parent.targets[0] if isinstance(parent, ast.Assign) and len(parent.targets) == 1 else None
        named = dotted(target) if target is not None else None
        if "optim" not in name.lower() and "optim" not in (named or "").lower():
            return
    if not index.module_ran(call):
        return
    s = index.subject(facts, "optimizer", call)
    put(s, "name", name)
    put(s, "custom", True)
    if through:
        put(s, "through_variable", True)


def _parameters(index: SourceIndex, node: ast.expr) -> bool:
    """`node` reads as a model's parameters: a `.parameters()` / `.named_parameters()` call, a name of
    parameters or parameter groups (`optimizer_grouped_parameters`, `params`, `self.params`)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
            "parameters", "named_parameters"):
        return True
    return isinstance(node, (ast.Name, ast.Attribute)) and "param" in index.text(node).lower()
