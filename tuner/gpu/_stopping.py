"""When to stop timing a kernel: once its median latency is known to a relative precision.

Pure (no GPU): :func:`._timing.time_kernel` feeds it the event-timed samples after
each batch of launches and it answers how many more launches to queue, 0 to stop.

The interval is the distribution-free confidence interval of the median from order statistics
(no normality, no bootstrap): with ``n`` samples sorted ``x(1) <= ... <= x(n)``, the true median
lies in ``[x(l), x(n+1-l)]`` with probability at least ``1 - 2 P(Binomial(n, 1/2) < l)``
whatever the distribution of the samples; ``l`` is the largest rank that keeps this at least
:data:`CONFIDENCE`. A few outliers (a launch delayed by a clock dip or a neighbour) move neither
the median nor these order statistics by more than a rank or two, so they neither hide a
precise median nor stop a noisy one early. With fewer than 6 samples no rank gives 95%
and the precision is unknown (``rel_ci`` None).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

__all__ = [
    "CONFIDENCE",
    "MAX_WARMUP_LAUNCHES",
    "TimingStats",
    "median_ci_rank",
    "next_batch",
    "timing_stats",
    "warmup_launches",
]

CONFIDENCE = 0.95
MAX_WARMUP_LAUNCHES = 50


def warmup_launches(warmup_ms: float, estimate_ms: float) -> int:
    """Launches before timing: about ``warmup_ms`` of kernel time at ``estimate_ms`` a launch, at least 1
    (the first launch after others pays for caches and clocks), at most :data:`MAX_WARMUP_LAUNCHES`."""
    if not estimate_ms > 0:
        return MAX_WARMUP_LAUNCHES if warmup_ms > 0 else 1
    return max(1, min(MAX_WARMUP_LAUNCHES, math.ceil(warmup_ms / estimate_ms)))


@functools.lru_cache(maxsize=4096)
def median_ci_rank(n: int, confidence: float = CONFIDENCE) -> int | None:
    """The 1-based rank ``l`` for which ``[x(l), x(n+1-l)]`` is a ``confidence`` interval of the median
    of ``n`` samples, the narrowest such; None when ``n`` is too small for any."""
    if n < 1:
        return None
    tail = (1 - Fraction(confidence)) / 2  # each tail may hold at most this much probability
    total = 1 << n
    cum, term, rank = 0, 1, None  # term = C(n, j)
    for j in range(n // 2 + 1):
        cum += term
        if Fraction(cum, total) > tail:  # P(B <= j) too large: l = j + 1 would not cover
            break
        rank = j + 1
        term = term * (n - j) // (j + 1)
    return rank


@dataclass(frozen=True, kw_only=True)
class TimingStats:
    median_ms: float
    spread: float  # interquartile range over the median
    rel_ci: float | None  # half-width of the median's confidence interval over the median; None: too few samples
    ci_low_ms: float | None
    ci_high_ms: float | None
    reps: int


def timing_stats(samples_ms: Sequence[float], confidence: float = CONFIDENCE) -> TimingStats:
    """Median, IQR/median and the median's confidence interval of at least one sample."""
    x = np.sort(np.asarray(samples_ms, dtype=np.float64))
    n = len(x)
    if n == 0:
        raise ValueError("timing_stats needs at least one sample")
    median = float(np.median(x))
    q1, q3 = np.percentile(x, [25, 75])
    scale = median if median > 0 else math.inf
    rank = median_ci_rank(n, confidence)
    low = high = rel = None
    if rank is not None:
        low, high = float(x[rank - 1]), float(x[n - rank])
        rel = (high - low) / 2 / scale
    return TimingStats(
        median_ms=median, spread=float(q3 - q1) / scale, rel_ci=rel, ci_low_ms=low, ci_high_ms=high, reps=n
    )


def next_batch(
    samples_ms: Sequence[float], *, spent_ms: float, min_reps: int, max_reps: int, budget_ms: float, rel_ci: float
) -> int:
    """Launches to queue next (0: stop) after ``samples_ms`` took ``spent_ms`` of wall time.

    Never stop below ``min_reps`` samples; stop at ``max_reps``, when the median is known to
    ``rel_ci``, or when the next launch would not fit in what is left of ``budget_ms``.
    A batch aims at the count that would reach ``rel_ci`` (the interval narrows as 1/sqrt(n)),
    between a quarter of the samples so far and doubling them, and within the budget left.
    """
    n = len(samples_ms)
    max_reps = max(max_reps, 1)
    least = max(min(min_reps, max_reps), 1)
    if n < least:
        return least - n
    if n >= max_reps:
        return 0
    stats = timing_stats(samples_ms)
    if stats.rel_ci is not None and stats.rel_ci <= rel_ci:
        return 0
    per_launch_ms = spent_ms / n if n else 0.0
    affordable = math.floor((budget_ms - spent_ms) / per_launch_ms) if per_launch_ms > 0 else max_reps - n
    if affordable < 1:
        return 0
    if stats.rel_ci is None or stats.rel_ci == math.inf or rel_ci <= 0:
        wanted = n
    else:
        wanted = math.ceil(n * (stats.rel_ci / rel_ci) ** 2) - n
    wanted = min(max(wanted, math.ceil(n / 4), 1), n)
    return max(0, min(wanted, affordable, max_reps - n))
