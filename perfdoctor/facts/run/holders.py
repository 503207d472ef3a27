"""The loss-holder probe's records (capture/probes/holders.py) -> one `loss_holder` subject per
container that keeps losses with their graphs across steps (PD006), with the process's memory
growth (memory.py) beside it."""

from __future__ import annotations

from perfdoctor.facts.model import site_subject
from perfdoctor.facts.run.context import RunContext


def add(ctx: RunContext) -> None:
    holders, growth = ctx.probes.loss_holders, ctx.growth
    ctx.facts.add("memory.loss_holders", len(holders), "count",
                  detail="containers the loss-holder scan found keeping losses with their graphs (PD006)")
    for h in holders:
        s = site_subject(ctx.facts, "loss_holder", h.site)
        if s is None:
            continue
        s.add("kind", h.kind)
        s.add("holder", h.holder)
        s.add("tensor_name", h.tensor_name)
        s.add("numel", h.numel, "count")
        s.add("graphs_retained", h.graphs_retained, "count")
        s.add("graphs_per_step", h.graphs_per_step, "count", detail=f"steps {h.first_step}..{h.last_step}")
        if growth is not None:
            s.add("growth_bytes_per_step", growth, "bytes",
                  detail="memory slope of the whole process" + (" (shared by all holders)" if len(holders) > 1 else ""))
