"""The stall sampler's records (capture/probes/stalls.py) -> `periodic_stall` subjects (PD020): steps
slower every N steps outside data loading and the wait for a CPU, named by the lines of the user's code
that the sampler saw on those steps and hardly ever on the others, ranked outermost first (`rank`); the
static read keeps the first that does not run on every step (`facts.static.periodic_stall.choose`)."""

from __future__ import annotations

import bisect
import statistics
from typing import Any

from perfdoctor.contracts.run import CpuWaitRecord
from perfdoctor.facts.model import site_subject
from perfdoctor.facts.run.context import RunContext

MIN_STALLS = 3  # slow steps a pattern needs among the steady steps (and other steps, as many)
SLOW_MADS = 2.0  # every slow step above the other steps' median by this many (scaled) MADs ...
SLOW_FRACTION = 0.2  # ... and at least this share of that median
SLOW_MIN_MS = 1.0  # ... and at least this much
HIT_RATE = 0.75  # share of the pattern's steps that must be that slow (a loaded machine hides a few)
DIRECT_PERIODS = 8  # periods up to this are all tried; longer ones where the slow steps' distances suggest them
NORMAL_MAX_SHARE = 0.10  # a line seen in more of the other steps' samples runs on every step
MAX_CANDIDATES = 4  # lines handed to the static read, the outermost first (`rank`)


def _cut(others: list[float]) -> float:
    """The time above which a step is slow against `others`: their median by clearly more than their
    spread (scaled MAD), a share of the median, and a floor."""
    med = statistics.median(others)
    spread = statistics.median(abs(v - med) for v in others) * 1.4826
    return med + max(SLOW_MADS * spread, SLOW_FRACTION * med, SLOW_MIN_MS)


def _least_spread(values: list[float], low: float, high: float, count: int) -> float:
    """A lower bound of the others' MAD when their median lies in [low, high]: the least d for which
    [low - d, high + d] holds `count` of the sorted `values` (a subset's j-th smallest distance from
    any centre in [low, high] is at least that)."""
    if bisect.bisect_right(values, high) - bisect.bisect_left(values, low) >= count:
        return 0.0
    a, b = 0.0, max(high - values[0], values[-1] - low)
    for _ in range(40):
        d = (a + b) / 2
        if bisect.bisect_right(values, high + d) - bisect.bisect_left(values, low - d) >= count:
            b = d
        else:
            a = d
    return a


def _bound(values: list[float], k: int) -> float:
    """The least `_cut` of the others can be when a class of at most `k` of the steps (`values`:
    their sorted times) is left out: removing k steps moves the others' median down by at most k/2
    places, and their MAD is at least `_least_spread`."""
    n = len(values)
    j = max(0, (n - k - 1) // 2)
    low, high = values[j], values[min(n - 1, (n + k) // 2 + 1)]
    return low + max(SLOW_MADS * 1.4826 * _least_spread(values, low, high, j + 1), SLOW_FRACTION * low, SLOW_MIN_MS)


def _candidates(slow: list[tuple[int, float]], span: int) -> list[int]:
    """The periods the slow steps (`slow`: (step, ms) in step order) suggest: the distances between
    consecutive slow steps, and over two (one other slow step between), and their halves and thirds
    (stalls missed between), among the slowest 3/4, 9/16, ... of them (a pattern's stalls stand out
    at some level above the others' noise). A distance counts where it occurs about as often as a
    pattern of that period with HIT_RATE of its stalls would make it: at least half its stalls less one."""
    cuts = sorted((v for _, v in slow), reverse=True)
    found: set[int] = set()
    size = len(cuts)
    while size >= MIN_STALLS:
        level = cuts[size - 1]
        at = [i for i, v in slow if v >= level]
        seen: dict[int, int] = {}
        for a in range(len(at) - 1):
            for b in (a + 1, a + 2):
                if b < len(at):
                    d = at[b] - at[a]
                    for m in (1, 2, 3):  # a stall between them missed (not slow, or not a steady step)
                        if d % m == 0:
                            seen[d // m] = seen.get(d // m, 0) + 1
        for p, c in seen.items():
            if p >= 2 and c >= max(1, (span // p) // 2 - 1):
                found.add(p)
        size = size * 3 // 4
    return sorted(found)


def _period(xs: list[tuple[int, float]]) -> tuple[int, list[int]] | None:
    """(period, the pattern's step indices) for `xs` ((step, ms) pairs): the smallest period with a
    residue class of at least MIN_STALLS steps, HIT_RATE of them slower than the other steps' median
    by clearly more than the others' spread (`_cut`); or None.

    O(n log n): a class's slow steps are among the steps above `_bound` (a look at the sorted times,
    not at the class), so the periods worth a look, past the first DIRECT_PERIODS, are the distances
    between those steps (`_candidates`; a pattern whose stalls no distance between slow steps shows
    is not told from noise); a period's classes are counted over those steps alone, and only a class
    that can pass is tested exactly (`_cut` of the others, as the pattern's definition says)."""
    n = len(xs)
    if n < 2 * MIN_STALLS:
        return None
    values = sorted(v for _, v in xs)
    steps = {i for i, _ in xs}
    time_of = dict(xs)
    lo_i, hi_i = min(steps), max(steps)
    span = hi_i - lo_i + 1

    def test(p: int, candidates: list[tuple[int, float]]) -> list[int] | None:
        bound = _bound(values, -(-span // p))
        hits: dict[int, int] = {}
        for i, v in candidates:
            if v > bound:
                hits[i % p] = hits.get(i % p, 0) + 1
        for r in sorted(r for r, h in hits.items() if h >= HIT_RATE * MIN_STALLS):
            members = [i for i in range(lo_i + (r - lo_i) % p, hi_i + 1, p) if i in steps]
            if len(members) < MIN_STALLS or n - len(members) < MIN_STALLS or hits[r] < HIT_RATE * len(members):
                continue
            on = set(members)
            cut = _cut([v for i, v in xs if i not in on])
            if sum(time_of[i] > cut for i in members) >= HIT_RATE * len(members):
                return members
        return None

    ordered = sorted(xs)
    for p in range(2, min(DIRECT_PERIODS, n // MIN_STALLS) + 1):  # large classes: every step looked at
        found = test(p, ordered)
        if found is not None:
            return p, found
    floor = _bound(values, -(-span // (DIRECT_PERIODS + 1)))  # the loosest bound of the longer periods
    slow = [(i, v) for i, v in ordered if v > floor]
    for p in _candidates(slow, span):
        if p > n // MIN_STALLS:
            break
        if p > DIRECT_PERIODS:
            found = test(p, slow)
            if found is not None:
                return p, found
    return None


def _own_ms(step: dict[str, Any], w: CpuWaitRecord | None) -> float:
    """A step's time that the script itself took outside data loading: less the training thread's
    wait for a CPU in it (a step that other processes slowed is no stall). Where some of the wait
    fell inside data loading it is taken out twice: a step may look faster than it was, never slower."""
    k = int(step["i"]) - 1
    wait = w.wait_ms[k] if w is not None and 0 <= k < len(w.wait_ms) else 0.0
    return max(0.0, step["wall_ms"] - (step.get("data_ms") or 0.0) - wait)


def add(ctx: RunContext) -> None:
    """PD020: steps slower every N steps outside data loading and the wait for a CPU, named by the line of the user's
    code that the sampler saw on those steps and hardly ever on the others (the outermost such
    line: the call in the loop, not a line inside the function it calls)."""
    facts, probes, steady = ctx.facts, ctx.probes, ctx.steady
    st = probes.stalls
    if st is None or len(steady) < 2 * MIN_STALLS:
        return
    xs = [(int(x["i"]), _own_ms(x, probes.cpu_wait)) for x in steady]
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
    candidates = []
    for line in st.lines:
        per = {int(i): int(c) for i, c in line.by_step}
        seen_on = sum(1 for i in watched if per.get(i, 0) > 0) / len(watched)
        share_norm = sum(per.get(i, 0) for i, _ in xs if i not in on) / n_norm if n_norm else 0.0
        # it runs on (nearly) every step of the pattern and hardly ever on the others (the sampler
        # looks about once a step, densely only late in a long step: how often it saw a line on a
        # stall says little of how long the line took, so the stall's time comes from the steps)
        if seen_on < HIT_RATE or share_norm > NORMAL_MAX_SHARE:
            continue
        candidates.append(((line.depth, -seen_on), line, seen_on))
    # the outermost first; the static read keeps the first that does not run on every step
    # (`facts.static.periodic_stall.choose`: an ordinary step is looked at once, at one phase, so a line
    # late in every step can pass the test above)
    candidates.sort(key=lambda c: c[0])
    for rank, (_, line, share) in enumerate(candidates[:MAX_CANDIDATES]):
        s = site_subject(facts, "periodic_stall", line.site)
        if s is None:
            continue
        s.add("rank", rank, "count", detail="the sampler's order of the lines seen on the pattern's steps only: the outermost first")
        s.add("period", p, "count", detail=f"steps {', '.join(str(i) for i in members)} of the steady steps")
        s.add("stalls", len(members), "count")
        s.add("extra_ms", extra, "ms", detail=f"mean over the pattern's steps, against the others' median "
              f"{base:.1f} ms (step time less data loading and the wait for a CPU)", per_step=tuple(extras))
        s.add("ms_per_step", sum(extras) / len(xs), "ms", detail=f"the stalls' extra time over {len(xs)} steady steps")
        s.add("share", share, "ratio", detail=f"of the {len(watched)} of the pattern's {len(on)} steps watched while they ran long; seen in at most "
              f"{NORMAL_MAX_SHARE:.0%} of the other steps' samples")
