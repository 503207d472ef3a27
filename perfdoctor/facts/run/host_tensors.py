"""The host-tensor probe's records (capture/probes/host_tensors.py) -> where the step moved host
tensors to a device, whatever function or file each line is in:

- a factory's tensors (PD004): one `cpu_to_device` subject per factory line, the move's line (or the
  line that indexed the model's computation with it: an implicit copy) as its second location, the moves per watched step, and `in_loop` from how many watched steps moved one
  (the run decides it over the source read's guess);
- a host tensor kept across steps and moved again on every step (PD004: a noise schedule made once,
  `self.alphas.to(x.device)[t]` in the step): a `cpu_to_device` subject at the move's line with
  `kept`, `in_loop` and the moves per watched step;
- a DataLoader's batches (PD003, PD017): on its `dataloader` subject, that the step moved them
  (`moved`, the move's line as a further location), whether every move passed non_blocking, and
  whether its batches reach the training step (`trains`: moved on most watched steps); one
  `batch_copy` subject per move line of a loader whose batches reach it (as the source read skips an
  evaluation's moves), with the loader's pin_memory where it pins and the move's non_blocking."""

from __future__ import annotations

import os

from perfdoctor.contracts.run import HostTensorRecord, Probes, Site
from perfdoctor.facts.model import Subject, also_at, site_subject
from perfdoctor.facts.run.context import RunContext

MIN_WATCHED = 4  # watched steps before the run says whether a loader's batches reach every step
MIN_WATCHED_LINES = 2  # watched steps before the run says which factory lines run in the step


def factory_lines(probes: Probes) -> dict[str, frozenset[int]] | None:
    """Per user file (its real path), the lines where a torch factory made a host tensor in the steps
    the probe watched: a factory line of the user's not among them did not run in the training step.
    None where the run cannot say: fewer than MIN_WATCHED_LINES steps watched, more lines than the
    probe kept, or a compiled region (its factories run in the graph, unseen by the probe)."""
    w = probes.host_factories
    return _watched_lines(probes, w.made if w is not None else [], w is not None and w.complete)


def move_lines(probes: Probes) -> dict[str, frozenset[int]] | None:
    """Per user file (its real path), the lines where the user's code moved a tensor to a device
    (`.to(device)`, `.cuda()`, `.type_as()`) in the steps the probe watched, whatever the tensor: a move
    line of the user's not among them did not run in the training step. None where the run cannot say,
    as for `factory_lines`."""
    w = probes.host_factories
    return _watched_lines(probes, w.moved if w is not None else [], w is not None and w.moves_complete)


def _watched_lines(probes: Probes, sites: list[Site], complete: bool) -> dict[str, frozenset[int]] | None:
    w = probes.host_factories
    if w is None or w.watched < MIN_WATCHED_LINES or not complete or (
            probes.compile is not None and probes.compile.frames):
        return None
    out: dict[str, set[int]] = {}
    for site in sites:
        out.setdefault(os.path.realpath(site.file), set()).add(site.line)
    return {f: frozenset(v) for f, v in out.items()}


def add(ctx: RunContext) -> None:
    w = ctx.probes.host_factories
    for frame in w.filled if w is not None else []:
        ctx.facts.subject("host_fill", frame).add("frame", frame, "str",
                                                  detail="wrote the host's values into a tensor of the step element "
                                                         "by element in the watched steps")
    loaders = {dl.id: dl for dl in ctx.probes.dataloaders}
    for r in ctx.probes.host_tensors:
        if r.moved is None:
            continue
        if r.kept:
            _kept(ctx, r)
            continue
        if r.dataset is not None:
            _per_sample(ctx, r)
            continue
        if r.loader is None:
            _factory(ctx, r)
            continue
        dl = loaders.get(r.loader)
        if dl is None:
            continue
        s = site_subject(ctx.facts, "dataloader", dl.judged_site)
        if s is not None:
            _also_at(s, r)
            s.add("moved", True, detail=f"{_where(r)}: .{r.how}() on {r.steps} of {r.watched} watched steps")
            if ctx.env.device != "cuda" and r.non_blocking is not None:
                s.add("non_blocking", r.non_blocking, detail=f"the moves at {_where(r)}")
            if r.watched >= MIN_WATCHED:
                s.add("trains", 2 * r.steps >= r.watched,
                      detail=f"its batches were moved on {r.steps} of {r.watched} watched training steps")
        if r.watched >= MIN_WATCHED and 2 * r.steps < r.watched:
            continue  # an evaluation loader's batches (moved on few watched steps): not the training step's copies
        b = site_subject(ctx.facts, "batch_copy", r.moved)
        if b is not None and r.how in ("to", "cuda"):
            if dl.kwargs.pin_memory:
                b.add("pinned", True, detail="the DataLoader whose batch this line moves was built with pin_memory=True")
            if r.non_blocking is not None:
                b.add("non_blocking", r.non_blocking, detail=f"{r.moves} moves seen")


def _factory(ctx: RunContext, r: HostTensorRecord) -> None:
    s = site_subject(ctx.facts, "cpu_to_device", r.site)
    if s is None:
        return
    _also_at(s, r)
    s.add("factory", r.factory, detail=f"numpy index arrays ({r.nbytes:,} bytes) at this line" if r.factory == "numpy"
          else f"Python lists of indices (about {r.nbytes:,} bytes as an index tensor) at this line"
          if r.factory == "list" else f"torch.{r.factory} at this line made the tensor on the host")
    _moves(s, r, "used as an index into the model's computation (copied to its device each call)" if r.how == "index"
           else f"moved with .{r.how}()")


def _per_sample(ctx: RunContext, r: HostTensorRecord) -> None:
    """A Dataset that moves each sample to the device as it is read: the move is PD004's (a copy per
    sample), and the loaders over that Dataset yield batches already on the device, which cannot be
    pinned (PD003, PD017 stand down)."""
    s = site_subject(ctx.facts, "cpu_to_device", r.moved)
    if s is None:
        return
    s.add("per_sample", True, detail=f"{r.dataset} moves each sample with .{r.how}() inside the DataLoader's fetch "
                                     f"({r.moves} moves on {r.steps} of {r.watched} watched steps)")
    _moves(s, r, f"moved with .{r.how}()")
    for dl in ctx.probes.dataloaders:
        if dl.dataset == r.dataset:
            d = site_subject(ctx.facts, "dataloader", dl.judged_site)
            if d is not None:
                d.add("samples_on_device", True, detail=f"{r.dataset} moves each sample to the device at {_where(r)}")


def _kept(ctx: RunContext, r: HostTensorRecord) -> None:
    s = site_subject(ctx.facts, "cpu_to_device", r.moved)
    if s is None:
        return
    s.add("kept", True, detail=f"the same host tensor ({r.nbytes:,} bytes), made before the steps, moved at {_where(r)} "
                               f"with .{r.how}() on {r.steps} of {r.watched} watched steps")
    _moves(s, r, f"moved with .{r.how}()")


def _moves(s: Subject, r: HostTensorRecord, how: str) -> None:
    """Whether the move is on every step (`in_loop`: on at least half the watched steps), how often the
    step moved the tensors and what one move carries (PD004 prices the copies with them on the target
    GPU: facts/trace/target_gpu.py)."""
    s.add("in_loop", r.watched >= 2 and 2 * r.steps >= r.watched, detail=f"{how} on {r.steps} of {r.watched} watched steps")
    s.add("moves_per_step", r.moves / max(r.watched, 1), "count",
          detail=f"{r.moves} moves at {_where(r)} over {r.watched} watched steps")
    if r.nbytes > 0:
        s.add("bytes_per_move", r.nbytes, "bytes", detail=f"the first tensor moved at {_where(r)}")


def _also_at(s: Subject, r: HostTensorRecord) -> None:
    assert r.moved is not None
    also_at(s, r.moved)


def _where(r: HostTensorRecord) -> str:
    return f"{r.moved.file.rsplit('/', 1)[-1]}:{r.moved.line}" if r.moved is not None else "?"
