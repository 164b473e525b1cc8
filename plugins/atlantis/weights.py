"""From cached response log-probs to one importance weight per example, all in log space.

log w = Σ_role sign · log p_role(y|x), each term length-normalised (none / per token / per byte), then divided
by the temperature, clipped (quantiles, or bounds relative to the mean weight), optionally Pareto-smoothed, and
self-normalised to mean 1 over the scored rows. Exponentiating only at the end means whole-sequence ratios of
thousands of nats never overflow. See `config.py` for the default and why.

>>> from datasets import Dataset
>>> scored = Dataset.from_dict({"large_base_logprob": [-10.0, -20.0], "small_base_logprob": [-12.0, -19.0],
...                             "response_bytes": [10, 10]})
>>> [round(w, 4) for w in compute_weights(scored, normalization="none", clip="none")["weight"]]
[1.9051, 0.0949]
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from datasets import Dataset

from kinfolk.plugins.atlantis.config import (
    FORMULAS,
    RESPONSE_BYTES_COLUMN,
    WeightConfig,
    logprob_column,
    resolve_config,
    tokens_column,
)
from kinfolk.plugins.atlantis.pareto import pareto_smooth
from kinfolk.tokens import DatasetFormatError

logger = logging.getLogger(__name__)


def log_mean_exp(values: np.ndarray) -> float:
    peak = float(np.max(values))
    return peak + float(np.log(np.mean(np.exp(values - peak))))


def combine_log_probs(
    log_probs: Mapping[str, np.ndarray],
    tokens: Mapping[str, np.ndarray] | None,
    response_bytes: np.ndarray | None,
    formula: str,
    normalization: str,
) -> np.ndarray:
    """The formula's signed sum of (length-normalised) role log-probs, one value per row."""
    total = None
    for role, sign in FORMULAS[formula].items():
        length = tokens[role] if normalization == "token" else response_bytes
        term = normalized_log_prob(log_probs[role], length, normalization)
        total = sign * term if total is None else total + sign * term
    return total


def column_array(dataset: Dataset, name: str) -> np.ndarray:
    """Column `name` of `dataset` (its selected rows, in order) as one numpy array, read through Arrow: datasets'
    numpy format iterates a column row by row (0.4 ms a row: seconds for a pool of a few thousand rows) and turns
    float64 into float32 when sliced; Arrow gives the stored values whole, at once."""
    return np.array(dataset.with_format("arrow")[:][name].to_numpy())


def normalized_log_prob(log_prob: np.ndarray, length: np.ndarray | None, normalization: str) -> np.ndarray:
    """One model's log-probs as a formula reads them: per sequence ('none'), or divided by `length`, the model's
    response token counts ('token') or the response bytes ('byte')."""
    term = np.asarray(log_prob, dtype=np.float64)
    return term if normalization == "none" else term / np.asarray(length, dtype=np.float64)


@dataclass
class StabilizedLogWeights:
    log_weights: np.ndarray
    n_clipped: int
    pareto_k: float | None  # None when smoothing was off


def stabilize(log_scores: np.ndarray, config: WeightConfig) -> StabilizedLogWeights:
    """Temperature, clipping, Pareto smoothing and self-normalisation of finite log scores."""
    log_weights = np.asarray(log_scores, dtype=np.float64) / config.temperature
    before = log_weights
    if config.clip == "quantile":
        low, high = np.quantile(log_weights, config.clip_quantiles)
        log_weights = np.clip(log_weights, low, high)
    elif config.clip == "absolute":
        centre = log_mean_exp(log_weights)
        low, high = np.log(config.clip_weights)
        log_weights = np.clip(log_weights, centre + low, centre + high)
    n_clipped = int(np.sum(log_weights != before))
    pareto_k = None
    if config.pareto_smoothing:
        log_weights, pareto_k = pareto_smooth(log_weights)
    if config.self_normalize:
        log_weights = log_weights - log_mean_exp(log_weights)
    return StabilizedLogWeights(log_weights, n_clipped, pareto_k)


@dataclass
class WeightResult:
    """Weights for every row (`skipped_weight` where a row was not scored) and how they were stabilised."""

    weights: np.ndarray
    scored: np.ndarray  # bool mask of rows with finite scores
    n_clipped: int
    pareto_k: float | None


def required_columns(config: WeightConfig) -> list[str]:
    columns = [logprob_column(role) for role in config.roles]
    if config.normalization == "token":
        columns += [tokens_column(role) for role in config.roles]
    if config.normalization == "byte":
        columns.append(RESPONSE_BYTES_COLUMN)
    return columns


def weights_from_scores(scored: Dataset, config: WeightConfig) -> WeightResult:
    """Compute the weights of a scored dataset under `config` (no forward pass)."""
    missing = [column for column in required_columns(config) if column not in scored.column_names]
    if missing:
        raise DatasetFormatError(
            f"formula {config.formula!r} with normalization {config.normalization!r} needs columns "
            f"{required_columns(config)}; missing {missing}; columns present: {sorted(scored.column_names)}"
        )
    log_probs = {role: column_array(scored, logprob_column(role)).astype(np.float64) for role in config.roles}
    tokens = None
    if config.normalization == "token":
        tokens = {role: column_array(scored, tokens_column(role)) for role in config.roles}
        counts = list(tokens.values())
        if any(not np.array_equal(counts[0], other) for other in counts[1:]):
            logger.warning(
                "the models of formula %r tokenise the responses differently; per-token scores of different "
                "tokenizers are not comparable, use normalization='byte'",
                config.formula,
            )
    response_bytes = column_array(scored, RESPONSE_BYTES_COLUMN) if config.normalization == "byte" else None
    log_scores = combine_log_probs(log_probs, tokens, response_bytes, config.formula, config.normalization)
    scored_rows = np.isfinite(log_scores)
    if not scored_rows.any():
        raise ValueError(f"no row of the {len(scored)} has finite scores for formula {config.formula!r}")
    stabilized = stabilize(log_scores[scored_rows], config)
    weights = np.full(len(scored), config.skipped_weight, dtype=np.float64)
    with np.errstate(over="ignore"):
        weights[scored_rows] = np.exp(stabilized.log_weights)
    if not np.all(np.isfinite(weights)):
        raise ValueError(
            f"weights overflow float64 (largest log weight {stabilized.log_weights.max():.1f}); "
            "keep self_normalize=True or use a length normalisation"
        )
    return WeightResult(weights, scored_rows, stabilized.n_clipped, stabilized.pareto_k)


def compute_weights(scored: Dataset, config: WeightConfig | None = None, **options) -> Dataset:
    """Add (or replace) the weight column of a scored dataset; `options` override `config` fields."""
    config = resolve_config(WeightConfig, config, options)
    result = weights_from_scores(scored, config)
    if config.weight_column in scored.column_names:
        scored = scored.remove_columns(config.weight_column)
    return scored.add_column(config.weight_column, result.weights.tolist())
