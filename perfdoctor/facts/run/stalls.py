"""The stall sampler's records (capture/probes/stalls.py) -> one `periodic_stall` subject (PD020):
steps slower every N steps outside data loading, named by the line of the user's code that the
sampler saw on those steps and hardly ever on the others."""

from __future__ import annotations

import statistics

from perfdoctor.facts.model import site_subject
from perfdoctor.facts.run.context import RunContext

MIN_STALLS = 3  # slow steps a pattern needs among the steady steps (and other steps, as many)
SLOW_MADS = 2.0  # every slow step above the other steps' median by this many (scaled) MADs ...
SLOW_FRACTION = 0.2  # ... and at least this share of that median
SLOW_MIN_MS = 1.0  # ... and at least this much
HIT_RATE = 0.75  # share of the pattern's steps that must be that slow (a loaded machine hides a few)
NORMAL_MAX_SHARE = 0.10  # a line seen in more of the other steps' samples runs on every step


def _period(xs: list[tuple[int, float]]) -> tuple[int, list[int]] | None:
    """(period, the pattern's step indices) for `xs` ((step, ms) pairs): the smallest period with a
    residue class of at least MIN_STALLS steps, HIT_RATE of them slower than the other steps' median
    by clearly more than the others' spread; or None."""
    for p in range(2, len(xs) // MIN_STALLS + 1):
        for r in range(p):
            members = [v for i, v in xs if i % p == r]
            others = [v for i, v in xs if i % p != r]
            if len(members) < MIN_STALLS or len(others) < MIN_STALLS:
                continue
            med = statistics.median(others)
            spread = statistics.median(abs(v - med) for v in others) * 1.4826
            cut = med + max(SLOW_MADS * spread, SLOW_FRACTION * med, SLOW_MIN_MS)
            if sum(v > cut for v in members) >= HIT_RATE * len(members):
                return p, [i for i, _ in xs if i % p == r]
    return None


def add(ctx: RunContext) -> None:
    """PD020: steps slower every N steps outside data loading, named by the line of the user's
    code that the sampler saw on those steps and hardly ever on the others (the outermost such
    line: the call in the loop, not a line inside the function it calls)."""
    facts, probes, steady = ctx.facts, ctx.probes, ctx.steady
    st = probes.stalls
    if st is None or len(steady) < 2 * MIN_STALLS:
        return
    xs = [(int(x["i"]), max(0.0, x["wall_ms"] - (x.get("data_ms") or 0.0))) for x in steady]
    found = _period(xs)
    if found is None:
        return
    p, members = found
    on = set(members)
    normal = [v for i, v in xs if i not in on]
    base = statistics.median(normal)
    extras = [max(0.0, v - base) for i, v in xs if i in on]
    extra = statistics.fmean(extras)
    samples = {int(i): int(c) for i, c in st.samples_by_step}
    n_slow = sum(samples.get(i, 0) for i in on)
    n_norm = sum(samples.get(i, 0) for i, _ in xs if i not in on)
    if not n_slow or not n_norm or extra <= 0:  # no look at the other steps: nothing to tell apart
        return
    # the pattern's steps the sampler watched while they ran long (a step looked at only before its
    # stall began says nothing of what the stall runs); a run file without them: every such step
    late = {int(i) for i, c in st.late_by_step if c > 0}
    watched = sorted(on & late) if late else sorted(on)
    if len(watched) < MIN_STALLS:
        return
    best = None
    for line in st.lines:
        per = {int(i): int(c) for i, c in line.by_step}
        seen_on = sum(1 for i in watched if per.get(i, 0) > 0) / len(watched)
        share_norm = sum(per.get(i, 0) for i, _ in xs if i not in on) / n_norm if n_norm else 0.0
        # it runs on (nearly) every step of the pattern and hardly ever on the others (the sampler
        # looks about once a step, densely only late in a long step: how often it saw a line on a
        # stall says little of how long the line took, so the stall's time comes from the steps)
        if seen_on < HIT_RATE or share_norm > NORMAL_MAX_SHARE:
            continue
        key = (line.depth, -seen_on)
        if best is None or key < best[0]:
            best = (key, line, seen_on)
    if best is None:
        return
    _, line, share = best
    s = site_subject(facts, "periodic_stall", line.site)
    if s is None:
        return
    s.add("period", p, "count", detail=f"steps {', '.join(str(i) for i in members)} of the steady steps")
    s.add("stalls", len(members), "count")
    s.add("extra_ms", extra, "ms", detail=f"mean over the pattern's steps, against the others' median "
          f"{base:.1f} ms (step time less data loading)", per_step=tuple(extras))
    s.add("ms_per_step", sum(extras) / len(xs), "ms", detail=f"the stalls' extra time over {len(xs)} steady steps")
    s.add("share", share, "ratio", detail=f"of the {len(watched)} of the pattern's {len(on)} steps watched while they ran long; seen in at most "
          f"{NORMAL_MAX_SHARE:.0%} of the other steps' samples")


