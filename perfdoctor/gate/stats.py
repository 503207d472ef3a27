"""Statistics for the CI gate, in pure Python (the gate never needs numpy or torch).

The model behind a timing verdict is a random-effects one: the median step time of one run is
    log m_run = log mu + u_run + e_run
where u_run is the run-to-run effect (process start, memory layout, CPU frequency, neighbours;
variance sigma_b^2) and e_run is the sampling error of the median of that run's steps. Steps
within a run are autocorrelated (a slow period lasts several steps), so e_run is measured with a
circular block bootstrap whose block length follows the series' own autocorrelation; an i.i.d.
bootstrap would understate it. sigma_b^2 can only come from repeated runs: the spread of the run
medians, less the part the within-run error already explains.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Sequence

Z95 = 1.959963984540054
N_BOOT = 2000


def block_length(x: Sequence[float]) -> int:
    """Block length for the block bootstrap: at least n^(1/3) (the classic rate), and at least
    twice the lag at which the autocorrelation stops being significant (|r_k| < 2/sqrt(n)), so a
    block spans the memory of the series; at most n/4 so there are several blocks to draw."""
    n = len(x)
    if n < 8:
        return 1
    mean = sum(x) / n
    d = [v - mean for v in x]
    var = sum(v * v for v in d)
    cap = max(1, n // 4)
    base = max(1, round(n ** (1 / 3)))
    if var <= 0:
        return min(base, cap)
    limit = 2 / math.sqrt(n)
    lag = cap
    for k in range(1, cap + 1):
        r = sum(d[i] * d[i + k] for i in range(n - k)) / var
        if abs(r) < limit:
            lag = k - 1
            break
    return max(1, min(cap, max(base, 2 * lag)))


def block_bootstrap_medians(x: Sequence[float], n_boot: int, rng: random.Random, block: int | None = None) -> list[float]:
    """Medians of `n_boot` circular block bootstrap resamples of the series x."""
    n = len(x)
    b = block or block_length(x)
    k = -(-n // b)  # blocks per resample
    xs = list(x) + list(x[:b])  # circular: a block may wrap around the end
    out = []
    for _ in range(n_boot):
        sample: list[float] = []
        for _ in range(k):
            s = rng.randrange(n)
            sample.extend(xs[s:s + b])
        out.append(statistics.median(sample[:n]))
    return out


def within_run_log_var(x: Sequence[float], rng: random.Random, n_boot: int = N_BOOT) -> float | None:
    """Variance of log(median of the run), from the block bootstrap. None for too short a run."""
    if len(x) < 6:
        return None
    meds = block_bootstrap_medians(x, n_boot, rng)
    logs = [math.log(m) for m in meds if m > 0]
    return statistics.pvariance(logs) if len(logs) > 1 else None


def between_run_log_var(run_medians: Sequence[float], within_vars: Sequence[float | None]) -> float | None:
    """sigma_b^2: the variance of log run medians beyond what the within-run error explains.
    None with fewer than two runs (it cannot be measured from one)."""
    meds = [m for m in run_medians if m and m > 0]
    if len(meds) < 2:
        return None
    total = statistics.variance([math.log(m) for m in meds])
    known = [v for v in within_vars if v is not None]
    within = sum(known) / len(known) if known else 0.0
    return max(0.0, total - within)


def side_center(run_medians: Sequence[float]) -> float:
    """The center of one side: the median of its run medians (the runs are the unit)."""
    return statistics.median(run_medians)


def ratio_interval(base_runs: Sequence[Sequence[float]], cur_runs: Sequence[Sequence[float]],
                   sigma_b2: float, df: int = 0, seed: int = 0, n_boot: int = N_BOOT) -> tuple[float, float, float]:
    """Point estimate and 95% percentile interval of center(current) / center(baseline).

    Each bootstrap replicate redraws every run's median by a block bootstrap of its own steps and
    multiplies it by a run effect exp(u), u ~ N(0, s^2), then takes each side's median of run
    medians. The run effect is what makes a single run on each side honest: a block bootstrap
    inside one run cannot see how far the next run will land. s^2 is itself uncertain when it was
    estimated from a few runs (`df` degrees of freedom): each replicate draws it from its
    posterior, s^2 = sigma_b2 * df / chi2(df), which widens the interval as a t distribution
    would (df=0 takes sigma_b2 as known). Deterministic for a given seed."""
    rng = random.Random(seed)

    def run_sd() -> float:
        if sigma_b2 <= 0:
            return 0.0
        if df <= 0:
            return math.sqrt(sigma_b2)
        return math.sqrt(sigma_b2 * df / rng.gammavariate(df / 2, 2))

    def replicates(runs: Sequence[Sequence[float]]) -> list[float]:
        per_run = [block_bootstrap_medians(r, n_boot, rng) for r in runs]
        out = []
        for i in range(n_boot):
            sd = run_sd()
            out.append(statistics.median([pr[i] * math.exp(rng.gauss(0.0, sd)) if sd else pr[i] for pr in per_run]))
        return out

    point = side_center([statistics.median(r) for r in cur_runs]) / side_center([statistics.median(r) for r in base_runs])
    b, c = replicates(base_runs), replicates(cur_runs)
    ratios = sorted(ci / bi for ci, bi in zip(c, b))
    lo = ratios[int(0.025 * (n_boot - 1))]
    hi = ratios[int(math.ceil(0.975 * (n_boot - 1)))]
    return point, lo, hi
