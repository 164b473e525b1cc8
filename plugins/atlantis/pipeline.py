"""`score_dataset`: a dataset in, the same dataset out with per-model scores and a weight column.

Reads top to bottom: check the rows, columns and responses → pre-flight checks of the models and the cache →
(optional) IFD selection → score each model in turn (one in memory at a time, cached per model) → response bytes
→ `compute_weights`. The weight step can be re-run on the result with other options, without any forward pass.

>>> import tempfile
>>> from kinfolk.testing import TinyKit, prompt_completion_dataset
>>> kit = TinyKit(tempfile.mkdtemp())
>>> family = kit.family("qwen2")
>>> scored = score_dataset(prompt_completion_dataset(6), large_base=family["large_base"],
...                        small_base=family["small_base"], reference=family["small_instruct"], use_cache=False)
>>> scored.column_names  # doctest: +NORMALIZE_WHITESPACE
['prompt', 'completion', 'large_base_logprob', 'large_base_tokens', 'small_base_logprob', 'small_base_tokens',
 'reference_logprob', 'reference_tokens', 'response_bytes', 'weight']
>>> round(sum(scored["weight"]) / len(scored), 6)
1.0
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from accelerate import PartialState
from datasets import Dataset

from kinfolk.errors import EmptyDatasetError, option
from kinfolk.plugins.atlantis.config import (
    RESPONSE_BYTES_COLUMN,
    ROLES,
    ScoreConfig,
    logprob_column,
    resolve_config,
    tokens_column,
)
from kinfolk.plugins.atlantis.preflight import check_scoring_inputs
from kinfolk.plugins.atlantis.scoring import ModelScores, ScoringError, process_state, score_model, text_columns
from kinfolk.plugins.atlantis.selection import ifd_scores, response_only_dataset, select_top_fraction
from kinfolk.plugins.atlantis.weights import compute_weights
from kinfolk.tokens import DatasetFormatError, response_bytes, response_text

logger = logging.getLogger(__name__)

IFD_COLUMN = "ifd"


def output_columns(config: ScoreConfig) -> list[str]:
    per_role = [name for role in ROLES for name in (logprob_column(role), tokens_column(role))]
    return [*per_role, RESPONSE_BYTES_COLUMN, IFD_COLUMN, config.weight_column]


def response_byte_counts(dataset: Dataset, text_field: str = "text") -> np.ndarray:
    """UTF-8 bytes of each row's response; refuses empty responses, naming the rows."""
    columns = text_columns(dataset, text_field)
    counts, empty = [], []
    for row, example in enumerate(dataset.select_columns(columns)):
        if not response_text(example, text_field).strip():
            empty.append(row)
        counts.append(response_bytes(example, text_field))
    if empty:
        shown = ", ".join(map(str, empty[:10])) + (f", ... ({len(empty)} rows)" if len(empty) > 10 else "")
        raise ScoringError(f"rows [{shown}] have an empty response; remove them before scoring")
    return np.asarray(counts, dtype=np.int64)


def _with_scores(dataset: Dataset, scores: ModelScores) -> Dataset:
    dataset = dataset.add_column(logprob_column(scores.role), scores.logprob.tolist())
    return dataset.add_column(tokens_column(scores.role), scores.tokens.tolist())


def _select_by_ifd(
    dataset: Dataset, model: str | Path, config: ScoreConfig, state: PartialState
) -> tuple[np.ndarray, np.ndarray, ModelScores]:
    """The rows to keep (top `select_fraction` by IFD), every row's IFD, and the kept rows' conditional scores."""
    role = config.ifd_model
    conditional = score_model(dataset, model, role, config, state)
    alone = score_model(response_only_dataset(dataset), model, f"{role}, response only", config, state)
    ifd = ifd_scores(conditional.logprob, conditional.tokens, alone.logprob, alone.tokens)
    keep = select_top_fraction(ifd, config.select_fraction)
    if state.is_main_process:
        logger.info("IFD selection kept %d of %d rows (by the %s model)", len(keep), len(dataset), role)
    if not len(keep):
        raise ScoringError(f"IFD selection kept no row: every row of {len(dataset)} has IFD >= 1 or no score")
    selected = ModelScores(
        role, conditional.model, conditional.logprob[keep], conditional.tokens[keep], conditional.skipped[keep]
    )
    return keep, ifd, selected


def score_dataset(
    dataset: Dataset,
    large_base: str | Path | None = None,
    small_base: str | Path | None = None,
    reference: str | Path | None = None,
    config: ScoreConfig | None = None,
    state: PartialState | None = None,
    **options,
) -> Dataset:
    """Score `dataset` with each given model and add the weight column (see `ScoreConfig` for `options`).

    Columns added: `<role>_logprob` (sum of response log-probs; NaN if the row was skipped) and `<role>_tokens`
    for each role given, `response_bytes`, `ifd` when `select_fraction` is set, and the weight column. Under
    `accelerate launch` every process returns the same dataset.
    """
    config = resolve_config(ScoreConfig, config, options)
    if len(dataset) == 0:
        raise EmptyDatasetError("the dataset to score has no rows")
    stale = [name for name in output_columns(config) if name in dataset.column_names]
    scored = dataset.remove_columns(stale) if stale else dataset
    byte_counts = response_byte_counts(scored, config.dataset_text_field)
    given = dict(zip(ROLES, (large_base, small_base, reference)))
    check_scoring_inputs(given, config)  # before any forward pass: models, the formula's needs, the cache
    state = state or process_state()
    models = {role: path for role, path in given.items() if path is not None}

    precomputed: dict[str, ModelScores] = {}
    if config.select_fraction is not None:
        keep, ifd, precomputed[config.ifd_model] = _select_by_ifd(scored, models[config.ifd_model], config, state)
        scored = scored.select(keep).add_column(IFD_COLUMN, ifd[keep].tolist())
        byte_counts = byte_counts[keep]
    for role, model in models.items():
        scores = precomputed.get(role) or score_model(scored, model, role, config, state)
        if scores.n_skipped and state.is_main_process:
            logger.warning("%s model %s: skipped %d overlong rows", role, model, scores.n_skipped)
        scored = _with_scores(scored, scores)
    scored = scored.add_column(RESPONSE_BYTES_COLUMN, byte_counts.tolist())
    return compute_weights(scored, config.weight_config())


def reweight_dataset(scored: Dataset, config: ScoreConfig | None = None, **options) -> Dataset:
    """New weights for a dataset `score_dataset` wrote, without a forward pass. With `select_fraction`, the rows
    with the highest IFD are kept first, read from its `ifd` column (there only if it was scored with
    `select_fraction`; IFD needs a response-only pass of the `ifd_model`, so a file without it must be scored
    again with that model given).

    >>> from datasets import Dataset
    >>> scored = Dataset.from_dict({"prompt": ["a", "b", "c", "d"], "completion": [" w", " x", " y", " z"],
    ...     "large_base_logprob": [-1.0, -2.0, -3.0, -4.0], "small_base_logprob": [-2.0, -2.0, -2.0, -2.0],
    ...     "response_bytes": [2, 2, 2, 2], "ifd": [0.9, 0.2, 0.7, 0.4]})
    >>> reweight_dataset(scored, select_fraction=0.5)["prompt"][:]
    ['a', 'c']
    """
    config = resolve_config(ScoreConfig, config, options)
    if config.select_fraction is not None:
        if IFD_COLUMN not in scored.column_names:
            raise DatasetFormatError(
                f"{option('select_fraction', config.select_fraction)} needs each row's IFD, and there is no "
                f"{IFD_COLUMN!r} column to select by; score the data with the {config.ifd_model} model given "
                f"({option(config.ifd_model, 'MODEL')}) to compute it"
            )
        keep = select_top_fraction(np.asarray(scored[IFD_COLUMN], dtype=np.float64), config.select_fraction)
        if not len(keep):
            raise ScoringError(f"IFD selection kept no row: every row of {len(scored)} has IFD >= 1 or none")
        logger.info("IFD selection kept %d of %d rows (by their %r column)", len(keep), len(scored), IFD_COLUMN)
        scored = scored.select(keep)
    return compute_weights(scored, config.weight_config())
