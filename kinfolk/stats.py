"""Statistics every kinfolk report uses: effective sample size, rank correlation, quantiles, geometric means,
paired bootstrap intervals, and the lab protocol's intervals over families (a t-interval with F − 1 degrees of
freedom, a two-stage cluster bootstrap, sign counts). NumPy only, so the numbers do not depend on which optional
packages are installed.

>>> from kinfolk.stats import effective_sample_size, spearman
>>> effective_sample_size([1.0, 1.0, 1.0, 1.0])
4.0
>>> round(spearman([1, 2, 3, 4], [10, 20, 30, 25]), 3)
0.8
"""

from __future__ import annotations

import math
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


def auc(scores: Sequence[float] | np.ndarray, positive: Sequence[bool] | np.ndarray) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties counting one half
    (the Mann-Whitney U statistic over n_pos · n_neg); NaN when either class is empty.

    >>> auc([0.9, 0.8, 0.3, 0.1], [True, False, True, False])
    0.75
    """
    x = np.asarray(scores, dtype=np.float64)
    is_positive = np.asarray(positive, dtype=bool)
    n_positive, n_negative = int(is_positive.sum()), int((~is_positive).sum())
    if n_positive == 0 or n_negative == 0:
        return float("nan")
    rank_sum = float(rankdata(x)[is_positive].sum())
    return (rank_sum - n_positive * (n_positive + 1) / 2.0) / (n_positive * n_negative)


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


def seeds_geometric_mean(values: Sequence[float | None]) -> float | None:
    """The geometric mean of per-seed drifts at one level (`kinfolk.drift.levels`'s rule): None when a seed's is
    missing (it never reached the level), 0 when one is 0 (reached undrifted: the product, and so the mean, is 0).

    >>> round(seeds_geometric_mean([0.02, 0.08]), 12), seeds_geometric_mean([0.02, 0.0]), seeds_geometric_mean([0.02, None])
    (0.04, 0.0, None)
    """
    if any(value is None for value in values):
        return None
    if any(value <= 0 for value in values):
        return 0.0
    return geometric_mean(values)


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


# ------------------------------------------------------------------------------------------ intervals over families
MIN_INTERVAL_UNITS = 5  # docs/protocol.md: fewer units than this get their values reported, never a "95 %" interval


class TooFewUnits(ValueError):
    """An interval was asked for from fewer than `MIN_INTERVAL_UNITS` units."""


def _regularised_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) by the continued fraction (modified Lentz), using the symmetry for x beyond the mean."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _regularised_incomplete_beta(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * fraction / a


def student_t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with `df` degrees of freedom.

    >>> round(student_t_cdf(2.776445, 4), 4)
    0.975
    """
    tail = 0.5 * _regularised_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t (bisection on `student_t_cdf`, to ~1e-12).

    >>> round(student_t_quantile(0.975, 4), 3)
    2.776
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"quantile level must lie in (0, 1), got {p}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if student_t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low < 1e-12:
            break
    return (low + high) / 2.0


def _check_units(values: np.ndarray, what: str) -> None:
    if values.size < MIN_INTERVAL_UNITS:
        raise TooFewUnits(
            f"{what} from {values.size} units: the lab protocol reports the values themselves below "
            f"{MIN_INTERVAL_UNITS} units, never a 95 % interval"
        )


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> Interval:
    """Mean of per-unit values (per-family paired differences) with a t-interval on n − 1 degrees of freedom.

    Raises `TooFewUnits` below `MIN_INTERVAL_UNITS` units.

    >>> interval = t_interval([0.21, 0.25, 0.19, 0.30, 0.22])
    >>> round(interval.estimate, 3), round(interval.low, 3), round(interval.high, 3)
    (0.234, 0.181, 0.287)
    """
    x = np.asarray(values, dtype=np.float64)
    _check_units(x, "a t-interval")
    mean = float(x.mean())
    half = student_t_quantile(0.5 + confidence / 2.0, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return Interval(mean, mean - half, mean + half, confidence)


def cluster_bootstrap_interval(
    runs_per_family: Sequence[Sequence[float]],
    n_resamples: int = 4000,
    confidence: float = 0.95,
    seed: int = 0,
) -> Interval:
    """Two-stage cluster bootstrap of a mean over families: resample families, then runs inside each drawn family.

    `runs_per_family[f]` holds family f's run-level values (paired differences); the estimate is the mean over
    families of their run means, so every family counts once whatever its number of runs. Raises `TooFewUnits`
    below `MIN_INTERVAL_UNITS` families.

    >>> interval = cluster_bootstrap_interval([[1.0, 1.2], [0.8, 1.0], [1.1], [0.9, 1.3], [1.0, 1.0]])
    >>> round(interval.estimate, 3), interval.low < interval.estimate < interval.high
    (1.04, True)
    """
    families = [np.asarray(runs, dtype=np.float64) for runs in runs_per_family]
    _check_units(np.asarray([runs.mean() if runs.size else np.nan for runs in families]), "a cluster bootstrap")
    if any(runs.size == 0 for runs in families):
        raise ValueError("cluster_bootstrap_interval: every family needs at least one run")
    estimate = float(np.mean([runs.mean() for runs in families]))
    rng = np.random.default_rng(seed)
    replicates = np.empty(n_resamples)
    sizes = [runs.size for runs in families]
    for r in range(n_resamples):
        drawn = rng.integers(0, len(families), size=len(families))
        # Indexing with `integers` draws what `rng.choice(runs, size)` draws (the same stream, so committed intervals
        # recompute to the bit) without choice's argument handling, a third of the time of a recompute.
        replicates[r] = np.mean([families[f][rng.integers(0, sizes[f], size=sizes[f])].mean() for f in drawn])
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(replicates, [tail, 1.0 - tail])
    return Interval(estimate, float(low), float(high), confidence)


def sign_count(values: Sequence[float] | np.ndarray, higher_is_better: bool = True) -> int:
    """How many units favour the method: positive differences (or negative ones when lower is better).

    >>> sign_count([0.2, -0.1, 0.05, 0.0, 0.3])
    3
    """
    x = np.asarray(values, dtype=np.float64)
    return int(np.sum(x > 0) if higher_is_better else np.sum(x < 0))


# ------------------------------------------------------------------------------------------ tests and corrections
def one_sample_t_p(values: Sequence[float] | np.ndarray, null: float = 0.0) -> float:
    """Two-sided p-value of a one-sample t-test of per-unit values against `null` (n − 1 degrees of freedom).

    With no spread the test is degenerate: p is 1 when the mean equals `null` and 0 otherwise (the convention the
    protocol's checker uses).

    >>> round(one_sample_t_p([0.21, 0.25, 0.19, 0.30, 0.22]), 5)
    0.00026
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        raise TooFewUnits(f"a t-test from {x.size} units")
    standard_error = float(x.std(ddof=1)) / math.sqrt(x.size)
    shift = float(x.mean()) - null
    if standard_error == 0.0:
        return 1.0 if shift == 0.0 else 0.0
    t = shift / standard_error
    df = x.size - 1
    return _regularised_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))  # both tails, without 1 − cdf's rounding


HOLM_LEVEL = 0.05  # a primary survives Holm's correction when its adjusted p-value is below this


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: the k-th smallest is multiplied by (m − k + 1),
    made non-decreasing along the order, and capped at 1.

    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    """
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[index]))
        adjusted[index] = round(running, 12)
    return adjusted


FLOOR_FACTOR = 10.0  # a ratio needs both of its values at least this many times the measured floor


def ratio_allowed(method: float, baseline: float, floor: float | None) -> bool:
    """Whether a ratio of two measured values may be computed: both must lie at least `FLOOR_FACTOR` times above the
    measured floor (for a divergence: an identity adapter's value under the same code and contexts). With no
    measured floor (None) the question cannot be answered here, and the ratio is allowed but must say so.

    >>> ratio_allowed(1e-3, 2e-3, 1e-5), ratio_allowed(1e-3, 5e-5, 1e-5), ratio_allowed(1e-3, 5e-5, None)
    (True, False, True)
    """
    if floor is None:
        return True
    return min(method, baseline) >= FLOOR_FACTOR * floor


def on_grid_edge(value: float, grid: Sequence[float]) -> bool:
    """Whether a selected value is the smallest or the largest of its grid (a one-point grid has no edge to
    extend, so it is not flagged).

    >>> on_grid_edge(0.03, [0.001, 0.003, 0.01, 0.03]), on_grid_edge(0.01, [0.001, 0.003, 0.01, 0.03])
    (True, False)
    """
    if len(grid) < 2:
        return False
    return value <= min(grid) or value >= max(grid)
