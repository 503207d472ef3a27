"""`nn.DataParallel(model)` constructions (PD001): one `dataparallel` subject per call, with the
callee as written (`dataparallel.callee`, which the fix rewrites)."""

from __future__ import annotations

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put

DATAPARALLEL = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                          "torch.nn.parallel.data_parallel.DataParallel"})


def detect(index: SourceIndex, facts: Facts) -> None:
    for call in index.calls:
        if index.qual(call.func) in DATAPARALLEL:
            put(index.subject(facts, "dataparallel", call), "callee", index.text(call.func))
