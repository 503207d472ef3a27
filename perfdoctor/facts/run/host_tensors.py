"""The host-tensor probe's records (capture/probes/host_tensors.py) -> one `cpu_to_device` subject
per factory line whose tensors the step moved to a device (PD004): the factory, the move's line as
the second location (any function, any file), the moves per watched step, and `in_loop` from how
many of the watched steps moved one (the run decides it over the source read's guess)."""

from __future__ import annotations

from perfdoctor.facts.model import site_subject
from perfdoctor.facts.run.context import RunContext
from perfdoctor.model import Location


def add(ctx: RunContext) -> None:
    for r in ctx.probes.host_tensors:
        s = site_subject(ctx.facts, "cpu_to_device", r.site)
        if s is None or r.moved is None:
            continue
        move = Location(r.moved.file, r.moved.line, r.moved.code, r.moved.function)
        if move not in s.locations:
            s.locations.append(move)
        watched = max(r.watched, 1)
        s.add("factory", r.factory, detail=f"torch.{r.factory} at this line made the tensor on the host")
        s.add("in_loop", r.watched >= 2 and 2 * r.steps >= r.watched,
              detail=f"moved with .{r.how}() on {r.steps} of {r.watched} watched steps")
        s.add("moves_per_step", r.moves / watched, "count",
              detail=f"{r.moves} moves at {r.moved.file.rsplit('/', 1)[-1]}:{r.moved.line} over {r.watched} watched steps")
