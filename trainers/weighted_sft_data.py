"""Per-token loss weights for weighted SFT: from a dataset's weight column to tensors aligned with a batch's labels.

Example weights are checked and transformed once per dataset (`WeightTransform`), then written on every token
(`token_weight_columns`), next to a second per-token column for the prompt/completion split, so both survive
truncation and packing the way TRL carries `input_ids` and `labels`. `WeightedCollator` wraps TRL's
`DataCollatorForLanguageModeling` and turns the columns into `loss_weights`, aligned with the collated `labels`
in padded and padding-free layouts, plus a small `weight_stats` vector of the sums every loss reduction and log
line needs (so gradient accumulation and DDP can add them up across micro-batches and ranks).

>>> from datasets import Dataset
>>> data = Dataset.from_dict({"input_ids": [[5, 6, 7]], "labels": [[-100, 6, 7]], "weight": [2.0]})
>>> transform = WeightTransform.fit(data, "weight")
>>> row = token_weight_columns(data[0], 0, transform, prompt_loss_weight=0.5)
>>> row["labels"], row[EXAMPLE_WEIGHTS].tolist(), row[TOKEN_LOSS_WEIGHTS].tolist()
([5, 6, 7], [2.0, 2.0, 2.0], [0.5, 1.0, 1.0])
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from datasets import Dataset, IterableDataset
from trl.data_utils import get_dataset_column_names
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from kinfolk.errors import WeightColumnError
from kinfolk.tokens import IGNORE_INDEX

# Dataset columns, one value per token.
EXAMPLE_WEIGHTS = "example_weights"  # the example's weight, repeated on each of its tokens
TOKEN_LOSS_WEIGHTS = "token_loss_weights"  # 1 on trained tokens, `prompt_loss_weight` on the others
TOKEN_COLUMNS = (EXAMPLE_WEIGHTS, TOKEN_LOSS_WEIGHTS)

# Batch keys added by `WeightedCollator`.
LOSS_WEIGHTS = "loss_weights"
TOKEN_MASS = "token_mass"  # the token loss weight alone (no example weight): the unweighted loss's weights
WEIGHT_STATS = "weight_stats"
# Layout of `weight_stats`: the three loss normalisers, then sums over the batch's trained examples (segments).
STAT_NAMES = ("token_mass", "examples", "weight_mass", "weight_sum", "weight_square_sum", "weight_min", "weight_max")
STAT = {name: index for index, name in enumerate(STAT_NAMES)}
# The normaliser each `weight_reduction` divides Σ W·ℓ by.
NORMALIZER = {"token": "token_mass", "sequence": "examples", "self_normalized": "weight_mass"}

_MAX_LISTED_ROWS = 10


def _is_weight(value: Any) -> bool:
    return isinstance(value, numbers.Real) and math.isfinite(value) and value >= 0


def _describe_rows(rows: list[int], values: list[Any]) -> str:
    listed = ", ".join(f"{row} ({values[row]!r})" for row in rows[:_MAX_LISTED_ROWS])
    more = len(rows) - _MAX_LISTED_ROWS
    return listed + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class WeightTransform:
    """Reads one example's weight: checks it, clips it to `[clip_min, clip_max]` and multiplies it by `scale`."""

    column: str
    clip_min: float | None = None
    clip_max: float | None = None
    scale: float = 1.0

    @classmethod
    def fit(
        cls,
        dataset: Dataset | IterableDataset,
        column: str,
        clip_min: float | None = None,
        clip_max: float | None = None,
        normalize: bool = False,
        dataset_name: str = "train",
    ) -> WeightTransform:
        """Check `dataset`'s weight column (all rows of a `Dataset`) and fit the dataset-level normalisation.

        Raises `WeightColumnError` naming the column and the columns present, or the offending rows, or when every
        (clipped) weight is 0.
        """
        columns = get_dataset_column_names(dataset) or []
        if column not in columns:
            raise WeightColumnError(
                f"the {dataset_name} dataset has no weight column {column!r}; columns present: {sorted(columns)}. "
                "Set `weight_column` to the column holding the weights, or to None to train without example weights."
            )
        transform = cls(column, clip_min, clip_max)
        if not isinstance(dataset, Dataset):
            if normalize:
                raise ValueError(
                    "normalize_weights=True needs the mean weight of the whole dataset, which a streamed "
                    "IterableDataset does not give; normalise the weights beforehand or pass a map-style Dataset."
                )
            return transform  # streamed rows are checked one by one as they are read
        values = list(dataset[column])
        bad = [row for row, value in enumerate(values) if not _is_weight(value)]
        if bad:
            raise WeightColumnError(
                f"the {dataset_name} dataset's weight column {column!r} has {len(bad)} invalid value(s) (weights must "
                f"be finite non-negative numbers) in rows {_describe_rows(bad, values)}"
            )
        clipped = np.clip(np.asarray(values, dtype=np.float64), clip_min, clip_max)
        if clipped.size and not clipped.any():
            raise WeightColumnError(
                f"every weight in the {dataset_name} dataset's weight column {column!r} is 0"
                + (" after clipping" if clip_max is not None and clip_max <= 0 else "")
                + f" ({len(values)} rows): the weighted loss would be 0 and training would change nothing"
            )
        if not normalize or not clipped.size:
            return transform
        return cls(column, clip_min, clip_max, 1.0 / float(clipped.mean()))

    def __call__(self, value: Any, row: int) -> float:
        if not _is_weight(value):
            raise WeightColumnError(
                f"weight column {self.column!r}: row {row} holds {value!r}; weights must be finite non-negative numbers"
            )
        weight = float(value)
        if self.clip_min is not None:
            weight = max(weight, self.clip_min)
        if self.clip_max is not None:
            weight = min(weight, self.clip_max)
        return weight * self.scale


def token_weight_columns(
    example: dict[str, Any],
    row: int,
    transform: WeightTransform | None,
    prompt_loss_weight: float,
    weight: float = 1.0,
) -> dict[str, Any]:
    """Per-token weight columns of one tokenised example (labels as TRL built them: -100 where it trains not).

    The example weight is `transform` applied to the example's weight column, or `weight` without a transform.
    With `prompt_loss_weight > 0` the untrained tokens get their labels back, since they now carry a loss.
    """
    labels = example["labels"]
    if transform is not None:
        weight = transform(example[transform.column], row)
    trained = np.asarray(labels) != IGNORE_INDEX
    columns = {
        EXAMPLE_WEIGHTS: np.full(len(labels), weight, dtype=np.float32),
        TOKEN_LOSS_WEIGHTS: np.where(trained, 1.0, prompt_loss_weight).astype(np.float32),
    }
    if prompt_loss_weight > 0:
        columns["labels"] = list(example["input_ids"])
    return columns


def has_completion_token(example: dict[str, Any]) -> bool:
    """Whether truncation left any token SFTTrainer itself trains on (its filter, extended to prompt weights)."""
    return any(weight >= 1.0 for weight in example[TOKEN_LOSS_WEIGHTS])


def _segment_lengths(example: dict[str, Any]) -> list[int]:
    # Packed rows (bfd) record their examples' lengths; any other row is one example.
    return list(example.get("seq_lengths") or [len(example["input_ids"])])


def _pad_rows(rows: list[torch.Tensor], width: int, value: float | int) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=rows[0].dtype)
    for index, row in enumerate(rows):
        out[index, : len(row)] = row
    return out


@dataclass
class WeightedCollator:
    """TRL's language-modelling collator plus `loss_weights` and `token_mass` (B, T) and `weight_stats`.

    `token_mass` = token loss weight on every position whose label TRL scores (labels != -100, not the first
    column, which nothing predicts), 0 elsewhere; `loss_weights` = example weight × `token_mass`. Both line up with
    `labels` in both layouts; `weight_stats` has len(STAT_NAMES) entries.
    """

    collator: DataCollatorForLanguageModeling

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        missing = [name for name in TOKEN_COLUMNS if name not in examples[0]]
        if missing:
            raise KeyError(
                f"the batch lacks the per-token weight columns {missing}: prepare the dataset with "
                "WeightedSFTTrainer (not with `skip_prepare_dataset`) and keep those columns"
            )
        batch = self.collator(examples)
        labels = batch["labels"]
        example_weights = [torch.as_tensor(example[EXAMPLE_WEIGHTS], dtype=torch.float32) for example in examples]
        token_weights = [torch.as_tensor(example[TOKEN_LOSS_WEIGHTS], dtype=torch.float32) for example in examples]
        segments, first = [], 0
        for example in examples:
            lengths = _segment_lengths(example)
            segments.append(torch.repeat_interleave(torch.arange(first, first + len(lengths)), torch.tensor(lengths)))
            first += len(lengths)
        if self.collator.padding_free:
            example_weights, token_weights, segments = (
                [torch.cat(rows)] for rows in (example_weights, token_weights, segments)
            )
        width = labels.shape[1]
        scored = labels != IGNORE_INDEX
        scored[:, 0] = False
        mass = _pad_rows(token_weights, width, 0.0) * scored
        weights = _pad_rows(example_weights, width, 0.0) * mass
        batch[LOSS_WEIGHTS] = weights
        batch[TOKEN_MASS] = mass
        batch[WEIGHT_STATS] = self._stats(mass, weights, _pad_rows(segments, width, first), first)
        return batch

    @staticmethod
    def _stats(mass: torch.Tensor, weights: torch.Tensor, segments: torch.Tensor, count: int) -> torch.Tensor:
        # Each example's weight, recovered as the mass-weighted mean over its scored tokens (the weight is constant
        # on an example), for the examples that have a scored token; padding goes to the extra bucket `count`.
        segment_mass = torch.zeros(count + 1).index_add_(0, segments.flatten(), mass.flatten())[:count]
        segment_weight = torch.zeros(count + 1).index_add_(0, segments.flatten(), weights.flatten())[:count]
        trained = segment_mass > 0
        example_weights = segment_weight[trained] / segment_mass[trained]
        empty = example_weights.numel() == 0
        return torch.stack(
            [
                mass.sum(),
                trained.sum().float(),
                weights.sum(),
                example_weights.sum(),
                example_weights.square().sum(),
                torch.tensor(math.inf) if empty else example_weights.min(),
                torch.tensor(-math.inf) if empty else example_weights.max(),
            ]
        )
