"""The DDP probe's records (capture/probes/ddp.py) -> one `ddp` subject per DistributedDataParallel
construction site (PD031, PD033) and one `ddp_sync` subject at the backward line of a DDP that
all-reduced on several backward passes of one optimizer step (PD032)."""

from __future__ import annotations

import ast
import statistics

from perfdoctor.contracts.run import DdpRecord
from perfdoctor.facts.model import Facts, site_subject
from perfdoctor.facts.run.context import RunContext


def add(ctx: RunContext) -> None:
    facts, idx = ctx.facts, [int(x["i"]) for x in ctx.steady]
    for r in ctx.probes.ddp:
        s = site_subject(facts, "ddp", r.site)
        if s is None:
            continue
        s.add("module", r.module)
        if r.built_by:
            s.add("built_by", r.built_by)
        s.add("find_unused_parameters", r.find_unused_parameters)
        s.add("gradient_as_bucket_view", r.gradient_as_bucket_view)
        s.add("static_graph", r.static_graph)
        s.add("params", r.params, "count")
        s.add("grad_bytes", r.grad_bytes, "bytes")
        rows = {int(row[0]): row for row in r.by_step if len(row) >= 4}
        synced = [int(min(rows[i][1], rows[i][3])) if i in rows else 0 for i in idx]
        if not idx:
            continue
        s.add("synced_steps", sum(1 for n in synced if n), "count", detail=f"of {len(idx)} steady steps")
        if r.steps_checked:
            s.add("steps_checked", r.steps_checked, "count", detail="steps whose used map (all-reduced by DDP) was read")
            s.add("unused_steps", r.unused_steps, "count",
                  detail=f"steps with a parameter some of the {r.world_size} ranks did not use")
        if r.find_unused_parameters and not r.static_graph:
            walk = tuple(float(rows[i][2]) if i in rows else 0.0 for i in idx)
            s.add("traversal_ms", statistics.fmean(walk), "ms",
                  detail=f"DDP's _post_forward with find_unused_parameters, mean over {len(idx)} steady steps",
                  per_step=walk)
        _accumulation(facts, r, idx, rows, synced)


def _accumulation(facts: Facts, r: DdpRecord, idx: list[int], rows: dict[int, list[float]], synced: list[int]) -> None:
    """`ddp_sync` at the backward line: the synchronising backward passes and all backward passes per
    optimizer step. Only for a run whose steps have more than one backward (gradient accumulation)."""
    backs = [int(rows[i][3]) if i in rows else 0 for i in idx]
    if not backs or statistics.median(backs) <= 1 or r.backward_site is None:
        return
    s = site_subject(facts, "ddp_sync", r.backward_site)
    if s is None:
        return
    s.add("syncs_per_step", statistics.median(synced), "count",
          detail=f"backward passes that all-reduced, median over {len(idx)} steady steps", per_step=tuple(synced))
    s.add("backwards_per_step", statistics.median(backs), "count", detail=f"median over {len(idx)} steady steps")
    if r.comm_ms is not None:
        over = f", {r.comm_overlap_ms:.2f} ms of it overlapped by backward compute" if r.comm_overlap_ms else ""
        s.add("comm_ms", r.comm_ms, "ms", detail=f"DDP's own timing of a backward's all-reduces{over}")
    s.add("model", _target(r.site.code if r.site else "") or "model")
    s.add("statement", r.backward_site.code)


def _target(code: str) -> str | None:
    """The name a `name = DDP(...)` statement assigns (`self.model` too), else None."""
    try:
        tree = ast.parse(code.strip())
    except SyntaxError:
        return None
    stmt = tree.body[0] if len(tree.body) == 1 else None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        t = stmt.targets[0]
    elif isinstance(stmt, ast.AnnAssign):
        t = stmt.target
    else:
        return None
    return ast.unparse(t) if isinstance(t, (ast.Name, ast.Attribute)) else None
