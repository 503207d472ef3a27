"""Moves of a pinned DataLoader's batches to the device (PD017): one `batch_copy` subject per
`.to(device)` / `.cuda()` of a batch of a DataLoader given `pin_memory=True`, keyed on the move's
line, with `non_blocking` as passed. From pinned memory a copy can run asynchronously; without
`non_blocking=True` the host still waits for it."""

from __future__ import annotations

import ast

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.dataloader import DATALOADER, batch_moves
from perfdoctor.facts.static.index import SourceIndex, kwarg, put


def detect(index: SourceIndex, facts: Facts) -> None:
    for call in index.calls:
        if index.qual(call.func) not in DATALOADER:
            continue
        pin = kwarg(call, "pin_memory")
        if not (isinstance(pin, ast.Constant) and pin.value is True):
            continue
        for move in batch_moves(index, call):
            nb = kwarg(move, "non_blocking")
            s = index.subject(facts, "batch_copy", move)
            put(s, "pinned", True)
            put(s, "non_blocking", isinstance(nb, ast.Constant) and nb.value is True)
