"""torch.optim constructions (PD021): one `optimizer` subject per call, with the class and the
`foreach` / `fused` arguments where they are given as literals (absent: torch's default, which on
CUDA is foreach)."""

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
        s = index.subject(facts, "optimizer", call)
        put(s, "name", cls)
        for arg in ("foreach", "fused"):
            v = kwarg(call, arg)
            if isinstance(v, ast.Constant) and isinstance(v.value, bool):
                put(s, arg, v.value)
