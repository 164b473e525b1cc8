import numpy as np
import pytest

from kinfolk.stats import (
    bootstrap_interval,
    effective_sample_size,
    geometric_mean,
    geometric_mean_interval,
    mean_interval,
    quantiles,
    rankdata,
    spearman,
)


def test_ess_identities():
    assert effective_sample_size([2.0] * 10) == pytest.approx(10)
    assert effective_sample_size([1.0] + [0.0] * 9) == pytest.approx(1)
    w = np.array([1.0, 2.0, 3.0])
    assert effective_sample_size(w) == pytest.approx(36 / 14)
    assert effective_sample_size(w * 7.5) == pytest.approx(36 / 14)  # scale-free


def test_rankdata_averages_ties():
    assert rankdata([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]


def test_spearman_matches_hand_computation():
    x = [1, 2, 3, 4, 5]
    y = [5, 6, 7, 8, 7]
    # ranks y: 1,2,3.5,5,3.5; pearson of ranks computed by hand
    rx, ry = np.array([1, 2, 3, 4, 5.0]), np.array([1, 2, 3.5, 5, 3.5])
    expected = np.sum((rx - 3) * (ry - 3)) / np.sqrt(np.sum((rx - 3) ** 2) * np.sum((ry - 3) ** 2))
    assert spearman(x, y) == pytest.approx(expected)
    assert spearman(x, [-v for v in x]) == pytest.approx(-1)
    assert np.isnan(spearman(x, [1, 1, 1, 1, 1]))


def test_quantiles_keys_and_values():
    q = quantiles(np.arange(101.0))
    assert list(q) == ["p1", "p5", "p25", "p50", "p75", "p95", "p99"]
    assert q["p50"] == 50 and q["p99"] == 99


def test_geometric_mean():
    assert geometric_mean([1, 4, 16]) == pytest.approx(4)
    with pytest.raises(ValueError, match="positive"):
        geometric_mean([1, 0])


def test_bootstrap_interval_brackets_estimate_and_is_paired():
    rng = np.random.default_rng(0)
    a = rng.normal(1.0, 1.0, 200)
    b = a - 0.5 + rng.normal(0, 0.01, 200)  # strongly paired: difference is ~0.5 with tiny noise
    paired = bootstrap_interval(lambda x, y: float(np.mean(x - y)), a, b)
    assert paired.low < paired.estimate < paired.high
    assert paired.high - paired.low < 0.01  # pairing removes the per-unit variance
    unpaired = bootstrap_interval(lambda x: float(np.mean(x)), a)
    assert unpaired.high - unpaired.low > 0.1


def test_bootstrap_rejects_misaligned_samples():
    with pytest.raises(ValueError, match="align"):
        bootstrap_interval(lambda x, y: 0.0, [1, 2], [1, 2, 3])


def test_geometric_mean_interval_and_mean_interval():
    interval = geometric_mean_interval([0.8, 0.9, 0.85, 0.95])
    assert interval.estimate == pytest.approx(geometric_mean([0.8, 0.9, 0.85, 0.95]))
    assert 0.8 <= interval.low <= interval.estimate <= interval.high <= 0.95
    single = mean_interval([3.0])
    assert single.low == single.high == 3.0
