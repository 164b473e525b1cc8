import numpy as np
import pytest

from kinfolk.stats import (
    TooFewUnits,
    auc,
    bootstrap_interval,
    cluster_bootstrap_interval,
    effective_sample_size,
    geometric_mean,
    geometric_mean_interval,
    mean_interval,
    quantiles,
    rankdata,
    sign_count,
    spearman,
    student_t_cdf,
    student_t_quantile,
    t_interval,
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


def test_student_t_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 4, 9, 30, 200):
        for p in (0.6, 0.9, 0.975, 0.995):
            assert student_t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9)
        for t in (-3.0, -0.4, 0.0, 1.7):
            assert student_t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), abs=1e-12)


def test_t_interval_by_hand_and_refuses_few_units():
    values = [0.21, 0.25, 0.19, 0.30, 0.22]
    mean = sum(values) / 5
    sd = (sum((v - mean) ** 2 for v in values) / 4) ** 0.5
    half = 2.7764451052 * sd / 5**0.5  # t(0.975, 4)
    interval = t_interval(values)
    assert (interval.estimate, interval.low, interval.high) == pytest.approx((mean, mean - half, mean + half))
    with pytest.raises(TooFewUnits, match="4 units"):
        t_interval(values[:4])
    with pytest.raises(TooFewUnits):
        cluster_bootstrap_interval([[1.0], [2.0], [3.0]])


def test_cluster_bootstrap_counts_families_once_and_widens_with_family_spread():
    # A family with many runs weighs as much as one with a single run.
    assert cluster_bootstrap_interval([[0.0] * 9, [1.0], [1.0], [1.0], [1.0]]).estimate == pytest.approx(0.8)
    tight = cluster_bootstrap_interval([[1.0, 1.01], [0.99, 1.0], [1.0, 1.0], [1.01, 0.99], [1.0, 1.0]])
    spread = cluster_bootstrap_interval([[0.5, 0.51], [1.5, 1.49], [1.0, 1.0], [0.2, 0.21], [1.8, 1.8]])
    assert tight.high - tight.low < 0.02 < spread.high - spread.low
    # Identical families leave only the run-level spread.
    runs = cluster_bootstrap_interval([[0.0, 2.0]] * 5)
    assert runs.low < 1.0 < runs.high


def test_sign_count_respects_direction():
    assert sign_count([0.1, -0.2, 0.3, 0.0, -0.4]) == 2
    assert sign_count([0.1, -0.2, 0.3, 0.0, -0.4], higher_is_better=False) == 2
    assert sign_count([-0.1, -0.2, -0.3, -0.1, 0.1], higher_is_better=False) == 4


def test_auc_counts_ordered_pairs_by_hand():
    scores = np.array([0.9, 0.5, 0.5, 0.2, 0.7, 0.1])
    positive = np.array([True, True, False, False, False, True])
    pairs = [(p, n) for p in scores[positive] for n in scores[~positive]]
    expected = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)
    assert auc(scores, positive) == pytest.approx(expected)
    assert auc([1, 2, 3], [False, False, True]) == 1.0
    assert np.isnan(auc([1, 2], [True, True]))


def test_one_sample_t_p_holm_floor_and_grid_edge_by_hand():
    from kinfolk.stats import holm, on_grid_edge, one_sample_t_p, ratio_allowed

    # [1, 2, 3, 4, 5] against 2: t = (3 - 2) / (sqrt(2.5) / sqrt(5)) = 1.41421 on 4 df -> p = 0.2301996 (scipy)
    assert one_sample_t_p([1.0, 2.0, 3.0, 4.0, 5.0], null=2.0) == pytest.approx(0.2301996, abs=1e-7)
    assert one_sample_t_p([0.5] * 5, null=0.5) == 1.0 and one_sample_t_p([0.7] * 5, null=0.5) == 0.0
    # Holm: sorted 0.01, 0.02, 0.04 -> 3 x 0.01 = 0.03, 2 x 0.02 = 0.04, 1 x 0.04 = 0.04; capped at 1
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.5, 0.9]) == [1.0, 1.0]
    assert ratio_allowed(1e-4, 1e-3, 1e-5) and not ratio_allowed(9e-5, 1e-3, 1e-5)
    assert on_grid_edge(0.5, [0.5, 1.0, 2.0]) and not on_grid_edge(1.0, [0.5, 1.0, 2.0])
    assert not on_grid_edge(1.0, [1.0])
