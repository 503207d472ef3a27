"""Change points in a script's step time over its recorded runs: where a shift is chronic, and which
runs were one-offs.

The method is PELT (Killick, Fearnhead and Eckley, "Optimal detection of changepoints with a linear
computational cost", JASA 107(500), 2012): the segmentation of the series that minimises the summed
cost of its segments plus a penalty per change, found exactly, with candidates pruned so that the
search stays linear in practice. The series is the log of each run's judged step time (a change is
then a ratio, the same at 5 ms and at 500 ms); the cost of a segment is its squared deviation from
its mean (a change in the mean of Gaussian noise).

- The noise, sigma, is estimated robustly from the differences of neighbouring runs (the median
  absolute deviation of the first differences, / 0.6745 / sqrt 2: a step change moves one
  difference, not the estimate).
- The penalty is PENALTY_PER_LOG_N * sigma^2 * ln(n). With 2 in place of 5 this is the Schwarz
  (BIC) penalty for a change in a Gaussian mean, which raises a false change on about a third of
  30-run series of pure noise once sigma is estimated from the series itself. With 5, on simulated
  series of log-normal noise (tests/history/test_history.py), false changes fall to about 4 % of 10-run
  series and under 1 % at 30 runs and more, while a 10 % shift in 3 % noise is still found at the
  right run (within 2) about 96 % of the time, a 30 % shift always.
- One-offs first: a run further than OUTLIER_SIGMAS from the runs on both sides of it is a
  one-off (another job held the machine), set aside before the search, so that one or two slow
  runs cannot fake a change.
- The noise is estimated again from the residuals around the levels found, and the search repeated
  with the larger estimate: on a short series the differences alone underestimate it about half the
  time.
- A change must last MIN_SEGMENT runs: a level needs runs to be told from noise.
- A change smaller than MIN_EFFECT (as a ratio) is not reported however certain: it is below what a
  gate would act on, and on a long quiet series the penalty alone would admit it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from perfdoctor.stats import median

PENALTY_PER_LOG_N = 5.0
MIN_SEGMENT = 3
MIN_EFFECT = 0.03  # 3 %
OUTLIER_SIGMAS = 4.0  # a run further than this from the runs on both sides is a one-off


@dataclass(frozen=True)
class Change:
    index: int  # the first run (0-based) of the new level
    before_ms: float  # the median of the segment before
    after_ms: float  # and after

    @property
    def ratio(self) -> float:
        return self.after_ms / self.before_ms - 1


@dataclass(frozen=True)
class Segmentation:
    changes: list[Change]
    outliers: list[int]  # runs (0-based) far from their segment's level: one-offs
    sigma: float  # the robust noise of log step time between neighbouring runs


def robust_sigma(x: Sequence[float]) -> float:
    """The noise of a series with level shifts: MAD of its first differences / 0.6745 / sqrt 2."""
    diffs = [b - a for a, b in zip(x, x[1:])]
    if not diffs:
        return 0.0
    m = median(diffs) or 0.0
    mad = median([abs(d - m) for d in diffs]) or 0.0
    return mad / 0.6745 / math.sqrt(2)


def pelt(x: Sequence[float], penalty: float, min_size: int = MIN_SEGMENT) -> list[int]:
    """The optimal change points (each the start index of a new segment) of `x` under the mean-change
    cost and `penalty` per change; segments at least `min_size` long. PELT's pruning keeps it near
    linear."""
    n = len(x)
    if n < 2 * min_size:
        return []
    s1 = [0.0] * (n + 1)
    s2 = [0.0] * (n + 1)
    for i, v in enumerate(x):
        s1[i + 1] = s1[i] + v
        s2[i + 1] = s2[i] + v * v

    def cost(a: int, b: int) -> float:  # squared deviation of x[a:b] from its mean
        d = s1[b] - s1[a]
        return max(0.0, s2[b] - s2[a] - d * d / (b - a))

    best = [math.inf] * (n + 1)
    best[0] = -penalty
    last = [0] * (n + 1)
    candidates = [0]
    for t in range(min_size, n + 1):
        usable = [s for s in candidates if t - s >= min_size]
        vals = [best[s] + cost(s, t) + penalty for s in usable]
        k = min(range(len(vals)), key=vals.__getitem__)
        best[t], last[t] = vals[k], usable[k]
        # prune: a start that cannot beat the best now never will (the cost is additive, K = 0)
        candidates = [s for s, v in zip(usable, vals) if v - penalty <= best[t]] + \
                     [s for s in candidates if t - s < min_size]
        candidates.append(t)
    cps = []
    t = n
    while t > 0:
        s = last[t]
        if s > 0:
            cps.append(s)
        t = s
    return sorted(cps)


def _one_offs(x: Sequence[float], scale: float) -> list[int]:
    """Runs far (OUTLIER_SIGMAS) from the runs on both sides of them (the median of the two before,
    and of the two after): one-offs, such as a run another job slowed, found before the change points
    so that one cannot fake a change. The first run of a new level is near the runs after it: no
    one-off."""
    out = []
    for j in range(len(x)):
        sides = [x[max(0, j - 2):j], x[j + 1:j + 3]]
        sides = [s for s in sides if s]
        if sides and all(abs(x[j] - (median(s) or 0.0)) > OUTLIER_SIGMAS * scale for s in sides):
            out.append(j)
    return out


def segment(values_ms: Sequence[float]) -> Segmentation:
    """Change points and one-offs of a series of per-run step times (ms, oldest first)."""
    if any(not v or v <= 0 for v in values_ms):
        raise ValueError("step times must be positive")
    x = [math.log(v) for v in values_ms]
    sigma = robust_sigma(x)
    if len(x) < 2 * MIN_SEGMENT:
        return Segmentation([], [], sigma)
    floor = max(sigma, 1e-4)  # a series of identical values still has a scale
    outliers = _one_offs(x, floor)
    keep = [j for j in range(len(x)) if j not in set(outliers)]
    y = [x[j] for j in keep]
    # the noise again, from the residuals around each level: the differences alone underestimate it on
    # a short series about as often as not; the larger of the two errs towards fewer false changes
    for _ in range(2):
        cps = pelt(y, PENALTY_PER_LOG_N * floor * floor * math.log(len(y)))
        bounds = [0, *cps, len(y)]
        levels = [median(y[a:b]) or 0.0 for a, b in zip(bounds, bounds[1:])]
        resid = [y[j] - lv for (a, b), lv in zip(zip(bounds, bounds[1:]), levels) for j in range(a, b)]
        again = (median([abs(r) for r in resid]) or 0.0) / 0.6745 * math.sqrt(len(resid) / max(1, len(resid) - len(levels)))
        if again <= floor:
            break
        floor = again
    changes = []
    for i, cp in enumerate(cps):
        before, after = math.exp(levels[i]), math.exp(levels[i + 1])
        if abs(after / before - 1) >= MIN_EFFECT:
            changes.append(Change(keep[cp], before, after))
    return Segmentation(changes, outliers, floor)
