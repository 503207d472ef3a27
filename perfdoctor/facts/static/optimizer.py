"""torch.optim constructions (PD021): one `optimizer` subject per call, with the class and the
`foreach` / `fused` arguments where they are given as literals (absent: torch's default, which on
CUDA is foreach). Not one built inside an `nn.Module` class the run's models never held and none of
whose methods its steps called (`SourceIndex.module_ran`: an algorithm class of a library of them, each
building its own optimizer, beside the one the run trains): the run never built it."""

from __future__ import annotations

import ast

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put
from perfdoctor.facts.static.index.syntax import kwarg

# the optimizers of torch.optim that take `foreach`
OPTIMIZERS = frozenset({"Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "ASGD", "NAdam", "RAdam",
                        "RMSprop", "Rprop", "SGD"})


def detect(index: SourceIndex, facts: Facts) -> None:
    for call in index.calls:
        q = index.qual(call.func) or ""
        mod, _, cls = q.rpartition(".")
        if mod not in ("torch.optim", f"torch.optim.{cls.lower()}") or cls not in OPTIMIZERS:
            continue
        if not index.module_ran(call):
            continue
        s = index.subject(facts, "optimizer", call)
        put(s, "name", cls)
        for arg in ("foreach", "fused"):
            v = kwarg(call, arg)
            if isinstance(v, ast.Constant) and isinstance(v.value, bool):
                put(s, arg, v.value)
