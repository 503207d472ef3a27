"""The host-read probe's records (capture/probes/host_reads.py) -> one `host_read` subject per line of
the user's code that read tensors on the host in the steady steps (PD008)."""

from __future__ import annotations

from perfdoctor.contracts.run import Site
from perfdoctor.facts.model import also_at, site_subject
from perfdoctor.facts.run.context import RunContext

HOST_READ_ORDER = ("item", "cpu", "tolist", "numpy", "float", "int", "bool", "print")
# steady steps a line must read on, every one of them from its first read to the last, for a later
# phase of training to be judged on its own steps (fewer: an evaluation at the run's end)
MIN_PHASE_STEPS = 5


def add(ctx: RunContext) -> None:
    """Each line's reads per step (the mean over the steady steps) and how. Several kinds on one
    line (`loss.cpu().numpy()`) are one value read once: the line counts its most frequent kind."""
    steady_idx = ctx.steady_idx
    per_line: dict[tuple[str, int], list[tuple[float, int, int, str, Site, Site | None]]] = {}
    for r in ctx.probes.host_reads:
        if r.site is None or not r.kind or not steady_idx:
            continue
        counts = [r.counts_per_step[i] if 0 <= i < len(r.counts_per_step) else 0 for i in steady_idx]
        first = next((k for k, c in enumerate(counts) if c > 0), None)
        if first is None:
            continue
        of = len(steady_idx)
        if first > 0 and of - first >= MIN_PHASE_STEPS and all(c > 0 for c in counts[first:]):
            # read on every step from its first one to the end: a later phase of training (a script that
            # trains an HMM, a CRF, then a BiLSTM-CRF), whose steps all read; judged over that phase
            counts, of = counts[first:], of - first
        mean = sum(counts) / of
        steps = sum(1 for c in counts if c > 0)
        per_line.setdefault((r.site.file, r.site.line), []).append((mean, steps, of, r.kind, r.site, r.caller))
    for rows in per_line.values():
        mean, steps, of, kind, site, _ = max(rows, key=lambda x: (x[0], -HOST_READ_ORDER.index(x[3])
                                                                    if x[3] in HOST_READ_ORDER else -99))
        s = site_subject(ctx.facts, "host_read", site)
        if s is not None:
            caller = next((row[5] for row in rows if row[5] is not None), None)
            if caller is not None:  # the training loop's line that called the reading helper
                also_at(s, caller)
            s.add("kind", kind)
            phase = "" if of == len(steady_idx) else f" from its first read, the last {of} of {len(steady_idx)}"
            s.add("count_per_step", mean, "count", detail=f"mean over {of} steady steps{phase}")
            # an evaluation or a histogram dump every N steps reads many values on one step and none
            # on the others: periodic work (PD020's), not a sync of every training step
            s.add("step_share", steps / of, "ratio", detail=f"read on {steps} of {of} steady steps{phase}")
