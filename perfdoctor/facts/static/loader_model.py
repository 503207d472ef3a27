"""The model beside the loader (PD025): on each `dataloader` subject of this file, the parameter
count of the largest model the run measured (`dataloader.model_params`, copied from the run's
`model` subjects with the run as its source). A batch of a few samples through a small model is
launch-bound on any GPU; through a large one it is not."""

from __future__ import annotations

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex


def detect(index: SourceIndex, facts: Facts) -> None:
    params = [p.value for m in facts.of_kind("model") if (p := m.facts.get("model.params")) is not None]
    if not params:
        return
    for s in facts.of_kind("dataloader"):
        if s.key.rsplit(":", 1)[0] == index.file:
            s.add("model_params", max(params), "count", "run", "parameters of the largest model the run saw")
