"""`torch.cuda.empty_cache()` calls (PD005): one `empty_cache` subject per call, with
`empty_cache.in_loop`: it runs on every training step (`Loops.per_step`: in the step loop's
body, not behind a periodic guard, or in a function called from there). A call once per epoch, once
per run, or in a loop over experiments that each train (a sweep) frees memory rarely and costs
nothing worth a finding; the run's own count, where there is one, is read instead."""

from __future__ import annotations

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put

EMPTY_CACHE = frozenset({"torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"})


def detect(index: SourceIndex, facts: Facts) -> None:
    for call in index.calls:
        if index.qual(call.func) in EMPTY_CACHE:
            put(index.subject(facts, "empty_cache", call), "in_loop", index.loops.per_step(call))
