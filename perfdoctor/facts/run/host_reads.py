"""The host-read probe's records (capture/probes/host_reads.py) -> one `host_read` subject per line of
the user's code that read tensors on the host in the steady steps (PD008)."""

from __future__ import annotations

from perfdoctor.contracts.run import Site
from perfdoctor.facts.model import also_at, site_subject
from perfdoctor.facts.run.context import RunContext

HOST_READ_ORDER = ("item", "cpu", "tolist", "numpy", "float", "int", "bool", "print")


def add(ctx: RunContext) -> None:
    """Each line's reads per step (the mean over the steady steps) and how. Several kinds on one
    line (`loss.cpu().numpy()`) are one value read once: the line counts its most frequent kind."""
    steady_idx = ctx.steady_idx
    per_line: dict[tuple[str, int], list[tuple[float, int, str, Site, Site | None]]] = {}
    for r in ctx.probes.host_reads:
        if r.site is None or not r.kind or not steady_idx:
            continue
        counts = [r.counts_per_step[i] for i in steady_idx if 0 <= i < len(r.counts_per_step)]
        mean = sum(counts) / len(steady_idx)
        if mean > 0:
            steps = sum(1 for c in counts if c > 0)
            per_line.setdefault((r.site.file, r.site.line), []).append((mean, steps, r.kind, r.site, r.caller))
    for rows in per_line.values():
        mean, steps, kind, site, _ = max(rows, key=lambda x: (x[0], -HOST_READ_ORDER.index(x[2])
                                                                if x[2] in HOST_READ_ORDER else -99))
        s = site_subject(ctx.facts, "host_read", site)
        if s is not None:
            caller = next((row[4] for row in rows if row[4] is not None), None)
            if caller is not None:  # the training loop's line that called the reading helper
                also_at(s, caller)
            s.add("kind", kind)
            s.add("count_per_step", mean, "count", detail=f"mean over {len(steady_idx)} steady steps")
            # an evaluation or a histogram dump every N steps reads many values on one step and none
            # on the others: periodic work (PD020's), not a sync of every training step
            s.add("step_share", steps / len(steady_idx), "ratio",
                  detail=f"read on {steps} of {len(steady_idx)} steady steps")
