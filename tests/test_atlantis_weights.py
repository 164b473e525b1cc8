"""ATLANTIS weights: every formula, normalisation and transform against a hand-written reference; diagnostics."""

import json
import logging
import math

import numpy as np
import pytest
from datasets import Dataset

from kinfolk.plugins.atlantis import (
    WeightConfig,
    compare_weights,
    compute_weights,
    format_report,
    ifd_scores,
    select_top_fraction,
    weight_report,
    write_report,
)
from kinfolk.plugins.atlantis.pareto import fit_generalized_pareto, pareto_smooth, tail_size
from kinfolk.plugins.atlantis.weights import column_array
from kinfolk.tokens import DatasetFormatError

RNG = np.random.default_rng(7)
N = 50
A = RNG.normal(-80, 20, N)  # large base
B = A - RNG.normal(5, 3, N)  # small base: a little worse
C = B + RNG.normal(2, 2, N)  # reference: the small base after tuning
TOKENS = {"large_base": RNG.integers(10, 60, N), "small_base": RNG.integers(10, 60, N), "reference": None}
TOKENS["reference"] = TOKENS["small_base"]  # same family, same tokenizer
BYTES = RNG.integers(30, 250, N)


def scored_dataset(**overrides) -> Dataset:
    columns = {
        "prompt": [f"p{i}" for i in range(N)],
        "large_base_logprob": A,
        "small_base_logprob": B,
        "reference_logprob": C,
        "large_base_tokens": TOKENS["large_base"],
        "small_base_tokens": TOKENS["small_base"],
        "reference_tokens": TOKENS["reference"],
        "response_bytes": BYTES,
    }
    columns.update(overrides)
    return Dataset.from_dict({k: list(np.asarray(v).tolist()) for k, v in columns.items()})


def reference_log_score(i: int, formula: str, normalization: str) -> float:
    """Row i's log score written out term by term."""
    a, b, c = A[i], B[i], C[i]
    if normalization == "token":
        a, b, c = a / TOKENS["large_base"][i], b / TOKENS["small_base"][i], c / TOKENS["reference"][i]
    elif normalization == "byte":
        a, b, c = a / BYTES[i], b / BYTES[i], c / BYTES[i]
    return {"ratio": a - b, "algorithm1": a - b + c, "influence": c - b}[formula]


def normalised(log_scores) -> np.ndarray:
    raw = np.array([math.exp(s - max(log_scores)) for s in log_scores])
    return raw / raw.mean()


@pytest.mark.parametrize("formula", ["ratio", "algorithm1", "influence"])
@pytest.mark.parametrize("normalization", ["none", "token", "byte"])
def test_formulas_and_normalisations_match_reference(formula, normalization):
    weights = compute_weights(scored_dataset(), formula=formula, normalization=normalization, clip="none")["weight"]
    expected = normalised([reference_log_score(i, formula, normalization) for i in range(N)])
    np.testing.assert_allclose(weights, expected, rtol=1e-10)


def test_temperature_divides_log_weights():
    for temperature in (0.25, 1.0, 4.0):
        weights = compute_weights(scored_dataset(), clip="none", temperature=temperature)["weight"]
        expected = normalised([reference_log_score(i, "ratio", "byte") / temperature for i in range(N)])
        np.testing.assert_allclose(weights, expected, rtol=1e-10)


def test_quantile_clipping_matches_reference():
    logs = np.array([reference_log_score(i, "influence", "token") for i in range(N)])
    low, high = np.quantile(logs, [0.1, 0.8])
    expected = normalised([min(max(s, low), high) for s in logs])
    weights = compute_weights(
        scored_dataset(), formula="influence", normalization="token", clip="quantile", clip_quantiles=[0.1, 0.8]
    )["weight"]
    np.testing.assert_allclose(weights, expected, rtol=1e-10)
    assert sum(s < low or s > high for s in logs) > 0


def test_absolute_clipping_bounds_weights_relative_to_the_mean():
    logs = np.array([reference_log_score(i, "ratio", "none") for i in range(N)])
    raw = normalised(logs)  # weights relative to their mean before clipping
    expected = normalised(np.log(np.clip(raw, 0.5, 2.0)))
    weights = compute_weights(scored_dataset(), normalization="none", clip="absolute", clip_weights=[0.5, 2.0])[
        "weight"
    ]
    np.testing.assert_allclose(weights, expected, rtol=1e-9)
    assert raw.max() > 2.0 and raw.min() < 0.5


def test_without_self_normalisation_weights_are_the_plain_ratio():
    weights = compute_weights(scored_dataset(), normalization="byte", clip="none", self_normalize=False)["weight"]
    np.testing.assert_allclose(weights, [math.exp((A[i] - B[i]) / BYTES[i]) for i in range(N)], rtol=1e-12)


def test_whole_sequence_ratios_of_thousands_of_nats_do_not_overflow():
    huge = scored_dataset(large_base_logprob=A + np.linspace(0, 3000, N))
    weights = np.array(compute_weights(huge, normalization="none", clip="none")["weight"])
    assert np.all(np.isfinite(weights)) and weights.mean() == pytest.approx(1.0)
    assert weights[-1] == pytest.approx(N)  # one row carries everything
    with pytest.raises(ValueError, match="overflow"):
        compute_weights(huge, normalization="none", clip="none", self_normalize=False)


def test_skipped_rows_get_the_skipped_weight_and_stay_out_of_the_mean():
    a = A.copy()
    a[[3, 9]] = np.nan
    weights = np.array(
        compute_weights(scored_dataset(large_base_logprob=a), clip="none", skipped_weight=0.0)["weight"]
    )
    keep = np.isfinite(a)
    assert weights[~keep].tolist() == [0.0, 0.0]
    expected = normalised([reference_log_score(i, "ratio", "byte") for i in np.flatnonzero(keep)])
    np.testing.assert_allclose(weights[keep], expected, rtol=1e-10)


def test_recomputing_replaces_only_the_weight_column():
    first = compute_weights(scored_dataset())
    second = compute_weights(first, formula="influence", weight_column="weight")
    assert first.column_names == second.column_names
    assert first["large_base_logprob"] == second["large_base_logprob"]
    assert first["weight"] != second["weight"]


def test_missing_score_columns_are_named():
    dataset = scored_dataset().remove_columns(["reference_logprob"])
    with pytest.raises(DatasetFormatError, match=r"missing \['reference_logprob'\].*columns present"):
        compute_weights(dataset, formula="algorithm1")


def test_unknown_option_is_refused_with_the_valid_ones():
    with pytest.raises(TypeError, match=r"unknown WeightConfig option.*'temprature'.*valid options"):
        compute_weights(scored_dataset(), temprature=2.0)
    with pytest.raises(ValueError, match="clip_quantiles"):
        WeightConfig(clip_quantiles=[0.9, 0.1])


def test_per_token_normalisation_warns_when_tokenizers_differ(caplog):
    with caplog.at_level(logging.WARNING):
        compute_weights(scored_dataset(), normalization="byte")
        assert "tokenise the responses differently" not in caplog.text
        compute_weights(scored_dataset(), normalization="token")  # large and small token counts differ
    assert "use normalization='byte'" in caplog.text


# --- Pareto smoothing ---------------------------------------------------------------------------------------


def generalized_pareto_sample(k: float, sigma: float, n: int, seed: int) -> np.ndarray:
    u = np.random.default_rng(seed).uniform(size=n)
    return sigma / k * ((1 - u) ** -k - 1)  # inverse CDF, written independently of the module


@pytest.mark.parametrize("k", [0.2, 0.5, 0.8])
def test_generalized_pareto_fit_recovers_the_shape(k):
    estimates = [fit_generalized_pareto(generalized_pareto_sample(k, 2.0, 4000, seed))[0] for seed in range(5)]
    assert np.mean(estimates) == pytest.approx(k, abs=0.06)


def test_generalized_pareto_fit_agrees_with_scipy_maximum_likelihood():
    stats = pytest.importorskip("scipy.stats")
    sample = generalized_pareto_sample(0.4, 1.5, 5000, seed=11)
    k, sigma = fit_generalized_pareto(sample)
    k_mle, _, sigma_mle = stats.genpareto.fit(sample, floc=0)
    assert k == pytest.approx(k_mle, abs=0.03) and sigma == pytest.approx(sigma_mle, rel=0.05)


def test_pareto_smoothing_replaces_only_the_tail_and_keeps_its_order():
    log_weights = np.log(generalized_pareto_sample(0.7, 1.0, 400, seed=3) + 1e-3)
    smoothed, k = pareto_smooth(log_weights)
    m = tail_size(400)
    tail = np.argsort(log_weights)[-m:]
    body = np.setdiff1d(np.arange(400), tail)
    np.testing.assert_array_equal(smoothed[body], log_weights[body])
    assert np.all(np.diff(smoothed[tail]) >= 0)  # same order as the raw tail
    assert smoothed.max() <= log_weights.max()
    assert 0.4 < k < 1.0
    assert np.var(np.exp(smoothed)) < np.var(np.exp(log_weights))


def test_pareto_smoothing_through_compute_weights_is_reported():
    report = weight_report(scored_dataset(), normalization="none", clip="none", pareto_smoothing=True)
    assert report["pareto_k"] is not None and np.isfinite(report["pareto_k"])
    assert report["mean"] == pytest.approx(1.0)


# --- diagnostics -------------------------------------------------------------------------------------------


def test_weight_report_against_hand_computation():
    report = weight_report(scored_dataset(), clip="none")
    w = normalised([reference_log_score(i, "ratio", "byte") for i in range(N)])
    assert report["n"] == N and report["skipped"] == 0
    assert report["ess"] == pytest.approx(w.sum() ** 2 / (w**2).sum())
    assert report["ess_over_n"] == pytest.approx(report["ess"] / N)
    assert report["fraction_above_1"] == pytest.approx(np.mean(w > 1))
    assert report["quantiles"]["p50"] == pytest.approx(np.median(w))
    assert report["min"] == pytest.approx(w.min()) and report["max"] == pytest.approx(w.max())
    stats = pytest.importorskip("scipy.stats")
    assert report["spearman_weight_length"] == pytest.approx(stats.spearmanr(w, BYTES).statistic)
    assert set(report["versus_other_formulas"]) == {"algorithm1", "influence", "large_base_only"}
    table = format_report(report)
    assert "ESS / N" in table and "vs influence" in table


def test_weights_that_follow_length_show_in_spearman():
    per_token_gain = np.full(N, 0.2)
    gain = per_token_gain * BYTES  # a constant per-byte advantage: whole-sequence ratios grow with length
    dataset = scored_dataset(large_base_logprob=B + gain)
    by_sequence = weight_report(dataset, normalization="none", clip="none")
    assert by_sequence["spearman_weight_length"] == pytest.approx(1.0, abs=1e-3)  # float noise breaks length ties
    flat = weight_report(dataset, normalization="byte", clip="none")
    assert flat["ess_over_n"] == pytest.approx(1.0)  # per byte, every row gets the same weight


def test_compare_weights_sign_disagreement_and_rank_correlation():
    a = np.array([0.2, 0.9, 1.1, 3.0, 0.5, 1.6])
    b = np.array([0.3, 1.2, 0.8, 2.0, 0.4, 1.9])
    result = compare_weights(a, b)
    assert result["sign_disagreement"] == pytest.approx(2 / 6)
    assert result["spearman"] == pytest.approx(1 - 6 * sum(d * d for d in [0, 1, -1, 0, 0, 0]) / (6 * 35))
    with pytest.raises(ValueError, match="same rows"):
        compare_weights(a, b[:3])


def test_write_report_is_strict_json_with_a_histogram(tmp_path):
    report = weight_report(scored_dataset(response_bytes=np.full(N, 10)), clip="none")
    assert math.isnan(report["spearman_weight_length"])  # constant lengths
    written = write_report(report, tmp_path, weights=np.ones(N))
    loaded = json.loads((tmp_path / "weights_report.json").read_text(), parse_constant=pytest.fail)
    assert loaded["spearman_weight_length"] is None and loaded["n"] == N
    # matplotlib is a core dependency: the histogram is drawn in every install, and decodes as a PNG image
    from matplotlib.image import imread

    histogram = tmp_path / "weights_hist.png"
    assert written[1] == histogram and histogram.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(histogram).shape[:2] == (400, 600)  # the 6 x 4 inch figure at 100 dpi


# --- IFD ---------------------------------------------------------------------------------------------------


def test_ifd_is_the_perplexity_ratio():
    conditional, alone = np.array([-12.0, -30.0]), np.array([-15.0, -29.0])
    tokens = np.array([4, 10])
    ppl = lambda total, n: math.exp(-total / n)  # noqa: E731
    expected = [ppl(conditional[i], tokens[i]) / ppl(alone[i], tokens[i]) for i in range(2)]
    np.testing.assert_allclose(ifd_scores(conditional, tokens, alone, tokens), expected)


def test_top_fraction_selection_drops_ifd_at_least_one_first():
    ifd = np.array([0.5, 1.2, 0.9, np.nan, 0.7, 0.95, 1.0, 0.1])
    assert select_top_fraction(ifd, 0.25).tolist() == [2, 5]  # ceil(2) highest below 1
    assert select_top_fraction(ifd, 0.25, drop_at_least_one=False).tolist() == [1, 6]
    assert select_top_fraction(ifd, 1.0).tolist() == [0, 2, 4, 5, 7]  # never more than the eligible rows


def test_columns_are_read_whole_in_the_rows_selected_order():
    """The formulas read each score column as stored (float64 to the bit, NaN kept), in the order of the rows a
    `select` or `shuffle` left, as the rows themselves give them one by one."""
    values = [float(v) for v in A[:8]]
    values[2] = math.nan  # an unscored row
    data = Dataset.from_dict(
        {"large_base_logprob": values, "large_base_tokens": [int(t) for t in TOKENS["large_base"][:8]]}
    )
    picked = data.select([5, 2, 7, 0]).shuffle(seed=3)
    for name in picked.column_names:
        read = column_array(picked, name)
        expected = np.array([row[name] for row in picked])
        assert read.dtype == expected.dtype and read.tobytes() == expected.tobytes(), name
