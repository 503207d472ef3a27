"""`torch.cuda.empty_cache()` calls (PD005): one `empty_cache` subject per call, with
`empty_cache.in_loop` (in a loop body, or in a function a loop body calls)."""

from __future__ import annotations

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put

EMPTY_CACHE = frozenset({"torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"})


def detect(index: SourceIndex, facts: Facts) -> None:
    for call in index.calls:
        if index.qual(call.func) in EMPTY_CACHE:
            put(index.subject(facts, "empty_cache", call), "in_loop", index.in_loop(call))
