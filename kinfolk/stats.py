"""Statistics every kinfolk report uses: effective sample size, rank correlation, quantiles, geometric means and
paired bootstrap intervals. NumPy only, so the numbers do not depend on which optional packages are installed.

>>> from kinfolk.stats import effective_sample_size, spearman
>>> effective_sample_size([1.0, 1.0, 1.0, 1.0])
4.0
>>> round(spearman([1, 2, 3, 4], [10, 20, 30, 25]), 3)
0.8
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


def effective_sample_size(weights: Sequence[float] | np.ndarray) -> float:
    """Kish's ESS = (Σw)² / Σw²; N for equal weights, 1 when a single weight carries everything."""
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0:
        return 0.0
    square_sum = float(np.sum(w * w))
    return float(np.sum(w) ** 2 / square_sum) if square_sum > 0 else 0.0


def rankdata(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Ranks starting at 1, ties sharing their average rank (scipy's "average" method)."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    ranks = np.empty(len(x), dtype=np.float64)
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    for start, end in zip(starts, ends):
        ranks[order[start:end]] = (start + end + 1) / 2.0
    return ranks


def pearson(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Pearson correlation; NaN when either side is constant."""
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"pearson needs equal lengths, got {a.shape} and {b.shape}")
    a = a - a.mean()
    b = b - b.mean()
    denominator = np.sqrt(np.sum(a * a) * np.sum(b * b))
    return float(np.sum(a * b) / denominator) if denominator > 0 else float("nan")


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Spearman's rank correlation (Pearson on average ranks); NaN when either side is constant."""
    return pearson(rankdata(x), rankdata(y))


def quantiles(values: Sequence[float] | np.ndarray, qs: Sequence[float] = DEFAULT_QUANTILES) -> dict[str, float]:
    """{"p1": ..., "p50": ...} with linear interpolation, as NumPy's default."""
    x = np.asarray(values, dtype=np.float64)
    return {f"p{round(q * 100):g}": float(np.quantile(x, q)) for q in qs}


def geometric_mean(values: Sequence[float] | np.ndarray) -> float:
    """exp(mean(log x)) of positive values; the right average for ratios such as KL(ATLAS)/KL(LoRA) over seeds."""
    x = np.asarray(values, dtype=np.float64)
    if np.any(x <= 0):
        raise ValueError(f"geometric mean needs positive values, got minimum {x.min()}")
    return float(np.exp(np.mean(np.log(x))))


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided bootstrap percentile interval."""

    estimate: float
    low: float
    high: float
    confidence: float = 0.95

    def as_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "confidence": self.confidence}

    def __str__(self) -> str:
        return f"{self.estimate:.4g} [{self.low:.4g}, {self.high:.4g}]"


def bootstrap_interval(
    statistic: Callable[..., float],
    *samples: Sequence[float] | np.ndarray,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Paired percentile bootstrap: the same resampled unit indices are applied to every sample.

    `samples` are aligned per unit (a question, a seed): `statistic(a[idx], b[idx], ...)` is recomputed on each
    resample. With one unit the interval collapses to the estimate.

    >>> bootstrap_interval(lambda a, b: float((a - b).mean()), [1.0, 2.0, 3.0], [0.0, 1.0, 2.0]).estimate
    1.0
    """
    arrays = [np.asarray(sample, dtype=np.float64) for sample in samples]
    if not arrays:
        raise ValueError("bootstrap_interval needs at least one sample")
    n = len(arrays[0])
    if n == 0:
        raise ValueError("bootstrap_interval needs at least one unit")
    for position, array in enumerate(arrays):
        if len(array) != n:
            raise ValueError(f"paired samples must align: sample 0 has {n} units, sample {position} has {len(array)}")
    estimate = float(statistic(*arrays))
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, n, size=(n_resamples, n))
    replicates = np.array([statistic(*(array[idx] for array in arrays)) for idx in indices], dtype=np.float64)
    replicates = replicates[np.isfinite(replicates)]
    if replicates.size == 0:
        return Interval(estimate, float("nan"), float("nan"), confidence)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(replicates, [tail, 1.0 - tail])
    return Interval(estimate, float(low), float(high), confidence)


def geometric_mean_interval(
    ratios: Sequence[float] | np.ndarray, n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> Interval:
    """Geometric mean of per-seed ratios with a bootstrap interval over seeds."""
    return bootstrap_interval(geometric_mean, ratios, n_resamples=n_resamples, confidence=confidence, seed=seed)


def mean_interval(
    values: Sequence[float] | np.ndarray, n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> Interval:
    """Mean with a bootstrap interval over units (seeds, questions)."""
    return bootstrap_interval(
        lambda x: float(np.mean(x)), values, n_resamples=n_resamples, confidence=confidence, seed=seed
    )
