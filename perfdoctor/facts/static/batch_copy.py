"""Moves of a pinned DataLoader's batches to the device (PD017): one `batch_copy` subject per
`.to(device)` / `.cuda()` / `.type(<CUDA tensor type>)` of a batch of a DataLoader that pins memory
on a CUDA device (`pin_memory=True`, `pin_memory=use_cuda`, a kwargs dict that sets it on the
accelerator path: `dataloader.pin_memory_on_cuda`), keyed on the move's line, with `non_blocking` as
passed. From pinned memory a copy can run asynchronously; without `non_blocking=True` the host still
waits for it. Moves in an evaluation loop beside the training loop (a loop with no training step
where another loop of the file takes them) are left out: they are not on the training step; so are the
moves of a loader whose batches do not reach the training step (`dataloader.trains` False: an evaluation
loader, by the source's read or by the run's, which saw them moved on few of the watched steps). A loader
built in one file whose batches another file's loop moves is read where the run saw them drawn
(`dataloader.drawn_moves`)."""

from __future__ import annotations

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.dataloader import DATALOADER, batch_moves, pin_memory_on_cuda, pinned_copy
from perfdoctor.facts.static.index import SourceIndex


def detect(index: SourceIndex, facts: Facts) -> None:
    loaders = {s.key: s for s in facts.of_kind("dataloader")}
    for call in index.calls:
        if index.qual(call.func) not in DATALOADER or pin_memory_on_cuda(index, call) is not True:
            continue
        dl = loaders.get(f"{index.file}:{call.lineno}")
        trains = dl.facts.get("dataloader.trains") if dl is not None else None
        if trains is not None and trains.value is False:
            continue  # an evaluation loader (the source's read, or the run's: moved on few watched steps)
        for move, loop in batch_moves(index, call):
            pinned_copy(index, facts, move, loop)
