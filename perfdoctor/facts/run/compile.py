"""The torch.compile probe's records (capture/probes/compile.py) -> one `graph_break` subject per user
line torch.compile broke a graph at or recompiled (PD029)."""

from __future__ import annotations

from perfdoctor.facts.model import site_subject
from perfdoctor.facts.run.context import RunContext


def add(ctx: RunContext) -> None:
    """PD029: each user line torch.compile broke a graph at, with dynamo's reason; each compiled
    function recompiled on the steady steps, with the guard that failed and the compile time spread
    over the steady steps."""
    facts, probes, steady = ctx.facts, ctx.probes, ctx.steady
    c = probes.compile
    if c is None:
        return
    idx = {x["i"] for x in steady}
    for b in c.graph_breaks:
        s = site_subject(facts, "graph_break", b.site)
        if s is None:
            continue
        s.add("kind", "graph break")
        s.add("reason", b.reason)
        steps = sorted(set(b.steps))  # dynamo may note a break twice in one compilation (its restart)
        s.add("count", len(steps), "count", detail=f"compilations that broke the graph here, at steps {_steps(steps)}")
    breaks = {(b.site.file, b.site.line) for b in c.graph_breaks if b.site is not None}
    for f in c.frames:
        later = f.compiles[1:]  # the first compilation of a frame is not a recompilation
        on = [ms for i, ms in ((int(x[0]), x[1]) for x in later) if i in idx]
        # (a frame resumed after a break starts at the break's line: that line is reported as the break)
        if not later or not idx or f.site is None or (f.site.file, f.site.line) in breaks:
            continue
        s = site_subject(facts, "graph_break", f.site)
        if s is None:
            continue
        s.add("kind", "recompile")
        s.add("reason", f.reasons[0] if f.reasons else "")
        s.add("count", len(later), "count", detail=f"recompilations of {f.name} at steps "
              f"{_steps([int(x[0]) for x in later])}")
        s.add("steady", len(on), "count", detail=f"of them on the {len(idx)} steady steps")
        if on:
            s.add("ms", sum(on) / len(idx), "ms", detail=f"{sum(on):.0f} ms compiling on the steady steps, "
                  f"spread over {len(idx)} steady steps")


def _steps(xs: list[int]) -> str:
    shown = ", ".join(str(i) for i in xs[:8])
    return shown + (f" and {len(xs) - 8} more" if len(xs) > 8 else "")


