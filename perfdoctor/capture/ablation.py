"""Ablations `perfdoctor verify` asks the child for (`--ablate KIND`): what a step would cost without a
part of its work, where no fix can be written against the user's line. Never used by `perfdoctor run`.

"data": every map-style DataLoader delivers its first batch again instead of loading the next one
(the step time if data were free). The sampler still advances, so an epoch has as many batches as
before and ends where it did; iterable datasets (whose end only the data says) are left alone. The
same batch object comes back each time: a script that changes a batch in place sees its own change
again, so the result is an upper bound on what faster data loading saves, not a fix.
"""

from __future__ import annotations

from typing import Any

from perfdoctor.capture.patches import Patches

KINDS = ("data",)


def install(torch: Any, kind: str) -> Patches:
    if kind not in KINDS:
        raise ValueError(f"unknown ablation {kind!r}")
    import torch.utils.data.dataloader as dl

    patches = Patches()
    first: dict[int, tuple[Any, Any]] = {}  # id(dataset) -> (the dataset, held alive; its first batch)
    for cls in (dl._SingleProcessDataLoaderIter, dl._MultiProcessingDataLoaderIter):
        orig = cls._next_data

        def _next_data(it: Any, _orig: Any = orig) -> Any:
            if it._dataset_kind != dl._DatasetKind.Map:
                return _orig(it)
            kept = first.get(id(it._dataset))
            if kept is None:
                batch = _orig(it)
                first[id(it._dataset)] = (it._dataset, batch)
                return batch
            it._next_index()  # the sampler advances (StopIteration at the epoch's end), nothing is loaded
            return kept[1]

        patches.replace(cls, "_next_data", _next_data)
    return patches
