"""Statistics for the CI gate, in pure Python (the gate never needs numpy or torch).

What a run contributes is a low quantile of its steady-state step times (GATE_QUANTILE, the 10th
percentile), not its median or mean. Contention from other jobs on a shared CI machine only ever
adds time, to the steps it happens to overlap, so it inflates the slow part of a run and barely
moves its fastest steps; a real slowdown of the training step (more work, a sync, a sleep) moves
every quantile alike. Measured on this project's 2-core test machine over 30 runs of a 200-step
script: the run-to-run spread (cv) of p10 was 2.4%, of the median 4.4% and of the mean 5.5%;
under bursty load from other processes, p10 2.6%, the median 26% and the mean 22%. The price: a
slowdown confined to fewer than 90% of the steps (a periodic checkpoint, a stall every few
batches) does not move it; the report's median and mean still show it.

The model behind a timing verdict is a random-effects one: the value of one run is
    log v_run = log mu + u_run + e_run
where u_run is the run-to-run effect (process start, memory layout, CPU frequency, neighbours;
variance sigma_b^2) and e_run is the sampling error of the quantile of that run's steps. Steps
within a run are autocorrelated (a slow period lasts several steps), so e_run is measured with a
circular block bootstrap whose block length follows the series' own autocorrelation; an i.i.d.
bootstrap would understate it. sigma_b^2 can only come from repeated runs: the spread of the run
values, less the part the within-run error already explains.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence

from perfdoctor.stats import quantile

Z95 = 1.959963984540054
N_BOOT = 2000
# The quantile of a run's steady steps that the gate judges (why p10: the module docstring).
GATE_QUANTILE = 0.10
# A run's value other than a quantile of its steps (`perfdoctor verify`: the median or the mean step)
Statistic = Callable[[Sequence[float]], float]


def _of(q: float, stat: Statistic | None) -> Statistic:
    return stat if stat is not None else (lambda xs: quantile(xs, q))


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


def block_bootstrap(x: Sequence[float], n_boot: int, rng: random.Random, q: float = 0.5,
                    block: int | None = None, stat: Statistic | None = None) -> list[float]:
    """q-quantiles of `n_boot` circular block bootstrap resamples of the series x."""
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
        out.append(quantile(sample[:n], q) if stat is None else stat(sample[:n]))
    return out


def within_run_log_var(x: Sequence[float], rng: random.Random, n_boot: int = N_BOOT,
                       q: float | None = None, stat: Statistic | None = None) -> float | None:
    """Variance of log(q-quantile of the run; GATE_QUANTILE by default), from the block bootstrap.
    None for too short a run."""
    if len(x) < 6:
        return None
    q = GATE_QUANTILE if q is None else q
    meds = block_bootstrap(x, n_boot, rng, q, stat=stat)
    logs = [math.log(m) for m in meds if m > 0]
    return statistics.pvariance(logs) if len(logs) > 1 else None


def between_run_log_var(run_values: Sequence[float], within_vars: Sequence[float | None]) -> float | None:
    """sigma_b^2: the variance of log run values beyond what the within-run error explains.
    None with fewer than two runs (it cannot be measured from one)."""
    meds = [m for m in run_values if m and m > 0]
    if len(meds) < 2:
        return None
    total = statistics.variance([math.log(m) for m in meds])
    known = [v for v in within_vars if v is not None]
    within = sum(known) / len(known) if known else 0.0
    return max(0.0, total - within)


def side_center(run_values: Sequence[float]) -> float:
    """The center of one side: the geometric mean of its runs' values (the runs are the unit)."""
    vals = [v for v in run_values if v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in vals))


def pooled_between_log_var(sides: Sequence[Sequence[Sequence[float]]], seed: int, min_steps: int,
                           q: float | None = None, stat: Statistic | None = None) -> tuple[float, int] | None:
    """sigma_b^2 pooled over the sides (each a list of runs' steady step times) that have two runs or
    more, all with `min_steps` steps, and its degrees of freedom; None where no side has repeats."""
    rng = random.Random(seed)
    of = _of(GATE_QUANTILE if q is None else q, stat)
    parts = []
    for side in sides:
        if len(side) >= 2 and all(len(r) >= min_steps for r in side):
            v = between_run_log_var([of(r) for r in side], [within_run_log_var(r, rng, 500, q, stat) for r in side])
            if v is not None:
                parts.append((len(side) - 1, v))
    if not parts:
        return None
    dof = sum(df for df, _ in parts)
    return sum(df * v for df, v in parts) / dof, dof


def side_replicates(base_runs: Sequence[Sequence[float]], cur_runs: Sequence[Sequence[float]],
                    sigma_b2: float, df: int = 0, seed: int = 0, n_boot: int | None = None,
                    q: float | None = None, stat: Statistic | None = None) -> tuple[list[float], list[float]]:
    """`n_boot` bootstrap replicates of each side's center, as logs, where a run's value is the
    q-quantile of its steps (or `stat` of them).

    Each bootstrap replicate redraws every run's value by a block bootstrap of its own steps and
    multiplies it by a run effect exp(u), u ~ N(0, s^2), then takes each side's center. The run
    effect is what makes a single run on each side honest: a block bootstrap inside one run
    cannot see how far the next run will land. s^2 is itself uncertain when it was estimated from
    a few runs (`df` degrees of freedom): each replicate draws it from its posterior,
    s^2 = sigma_b2 * df / chi2(df), which widens the interval as a t distribution would (df=0
    takes sigma_b2 as known). Deterministic for a given seed."""
    rng = random.Random(seed)
    q = GATE_QUANTILE if q is None else q
    n_boot = n_boot or N_BOOT

    def run_sd() -> float:
        if sigma_b2 <= 0:
            return 0.0
        if df <= 0:
            return math.sqrt(sigma_b2)
        return math.sqrt(sigma_b2 * df / rng.gammavariate(df / 2, 2))

    def replicates(runs: Sequence[Sequence[float]]) -> list[float]:
        """Each replicate's side center, as its log: a run effect drawn from a wide posterior (a
        noisy baseline of two runs, df=1) can be exp(±1000), which as a factor overflows to inf or
        underflows to 0 (and a side of one run then had no value left to take the mean of)."""
        per_run = [block_bootstrap(r, n_boot, rng, q, stat=stat) for r in runs]
        out = []
        for i in range(n_boot):
            sd = run_sd()
            out.append(statistics.fmean([math.log(pr[i]) + (rng.gauss(0.0, sd) if sd else 0.0)
                                         for pr in per_run if pr[i] > 0] or [0.0]))
        return out

    return replicates(base_runs), replicates(cur_runs)


def _percentiles(values: list[float], level: float) -> tuple[float, float]:
    values = sorted(values)
    tail = (1 - level) / 2
    return values[int(tail * (len(values) - 1))], values[int(math.ceil((1 - tail) * (len(values) - 1)))]


def ratio_interval(base_runs: Sequence[Sequence[float]], cur_runs: Sequence[Sequence[float]],
                   sigma_b2: float, df: int = 0, seed: int = 0, n_boot: int | None = None,
                   q: float | None = None, level: float = 0.90, stat: Statistic | None = None
                   ) -> tuple[float, float, float]:
    """Point estimate and `level` percentile interval of center(current) / center(baseline)
    (`side_replicates`)."""
    of = _of(GATE_QUANTILE if q is None else q, stat)
    point = side_center([of(r) for r in cur_runs]) / side_center([of(r) for r in base_runs])
    b, c = side_replicates(base_runs, cur_runs, sigma_b2, df, seed, n_boot, q, stat)
    lo, hi = _percentiles([math.exp(max(-700.0, min(700.0, ci - bi))) for ci, bi in zip(c, b)], level)
    return point, lo, hi


def difference_interval(base_runs: Sequence[Sequence[float]], cur_runs: Sequence[Sequence[float]],
                        sigma_b2: float, df: int = 0, seed: int = 0, n_boot: int | None = None,
                        q: float | None = None, level: float = 0.90, stat: Statistic | None = None
                        ) -> tuple[float, float, float]:
    """Point estimate and `level` percentile interval of center(baseline) - center(current), in the
    runs' unit (`perfdoctor verify`'s saving per step): both centers' uncertainty in it, which a
    ratio's interval scaled by the baseline's point would leave out (`side_replicates`)."""
    of = _of(GATE_QUANTILE if q is None else q, stat)
    point = side_center([of(r) for r in base_runs]) - side_center([of(r) for r in cur_runs])
    b, c = side_replicates(base_runs, cur_runs, sigma_b2, df, seed, n_boot, q, stat)
    lo, hi = _percentiles([math.exp(min(700.0, bi)) - math.exp(min(700.0, ci)) for ci, bi in zip(c, b)], level)
    return point, lo, hi
