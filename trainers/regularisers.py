"""Regularisers against forgetting, as options of `WeightedSFTTrainer` (ATLAS's comparators).

Both use retained data: examples of what the model should keep doing (e.g. GSM8K while learning MBPP), in any SFT
format, given as the trainer's `retained_dataset` or as `retained_dataset_name` in the config.

- Replay (`replay_ratio` r, `replay_weight`): the training set gains round(r/(1−r)·N) retained examples (a seeded
  sample, cycling through the retained set when it is smaller), so a fraction r of the examples the trainer samples
  into its batches are retained ones; they are trained with the SFT loss at weight `replay_weight`.
- Output-KL (`output_kl_coef` λ): every training micro-batch adds λ·KL(frozen‖current), the mean over the scored
  tokens of a retained batch, with the frozen distribution from the PEFT model with its adapters disabled; computed by
  `kinfolk.divergence` (tiled over the vocabulary, never full logits). Which retained rows a micro-batch gets follows
  from the global step, the micro-batch and the rank, so resuming from a checkpoint sees the same retained batches.

>>> from kinfolk.testing import prompt_completion_dataset
>>> batches = RetainedBatches(prompt_completion_dataset(5), batch_size=2, seed=0)
>>> sorted(batches.rows(0) + batches.rows(1) + batches.rows(2)[:1])  # one pass covers every row once
[0, 1, 2, 3, 4]
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from datasets import Dataset, concatenate_datasets

from kinfolk.divergence import DisabledAdapter, token_divergence
from kinfolk.sharding import HEAD_OUTSIDE_FORWARD, refuse_under_sharding
from kinfolk.tokens import IGNORE_INDEX
from kinfolk.trainers.weighted_sft_data import TOKEN_COLUMNS, TOKEN_LOSS_WEIGHTS


def replay_mix(train: Dataset, retained: Dataset, ratio: float, seed: int) -> Dataset:
    """`train` plus round(ratio/(1−ratio)·len(train)) retained rows, shuffled together with `seed`.

    Both must be tokenised with the weight columns; only `input_ids`, `labels` and those columns are kept.
    """
    if not isinstance(train, Dataset) or not isinstance(retained, Dataset):
        raise TypeError("replay needs map-style datasets (not IterableDataset) for the training and retained data")
    if len(retained) == 0:
        raise ValueError("replay_ratio > 0 but the retained dataset is empty")
    count = round(ratio / (1.0 - ratio) * len(train))
    rng = np.random.default_rng(seed)
    passes = [rng.permutation(len(retained)) for _ in range(-(-count // len(retained)))]
    rows = np.concatenate(passes)[:count] if passes else np.zeros(0, dtype=np.int64)
    columns = ["input_ids", "labels", *TOKEN_COLUMNS]
    mixed = concatenate_datasets([train.select_columns(columns), retained.select_columns(columns).select(rows)])
    return mixed.shuffle(seed=seed)


class RetainedBatches:
    """Retained batch `index` → its rows: consecutive slices of seeded permutations, one permutation per pass."""

    def __init__(self, dataset: Dataset, batch_size: int, seed: int):
        if len(dataset) == 0:
            raise ValueError("the retained dataset is empty")
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self._permutation = lru_cache(maxsize=4)(self._make_permutation)

    def _make_permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.dataset))

    def rows(self, index: int) -> list[int]:
        size = len(self.dataset)
        positions = range(index * self.batch_size, (index + 1) * self.batch_size)
        return [int(self._permutation(position // size)[position % size]) for position in positions]

    def batch(self, index: int) -> list[dict[str, Any]]:
        return [self.dataset[row] for row in self.rows(index)]


class OutputKL:
    """λ·KL(frozen‖current) on retained batches; the frozen side is the PEFT model with its adapters disabled."""

    def __init__(self, batches: RetainedBatches, collator: Callable, divergence: str = "forward_kl"):
        self.batches, self.collator, self.divergence = batches, collator, divergence

    def __call__(self, model: torch.nn.Module, index: int, prepare_inputs: Callable) -> torch.Tensor:
        """Mean divergence over the tokens SFT trains of retained batch `index` (differentiable; 0 if none).

        `model` is the unwrapped PEFT model; `prepare_inputs` moves a collated batch to its device.
        """
        rows = [
            {
                "input_ids": row["input_ids"],
                # the tokens SFTTrainer trains (prompt tokens kept only for a prompt loss weight are left out)
                "labels": [
                    label if weight >= 1.0 else IGNORE_INDEX
                    for label, weight in zip(row["labels"], row[TOKEN_LOSS_WEIGHTS])
                ],
            }
            for row in self.batches.batch(index)
        ]
        inputs = prepare_inputs(self.collator(rows))
        input_ids, labels = inputs.pop("input_ids"), inputs.pop("labels")
        attention_mask = inputs.pop("attention_mask", None)
        return token_divergence(
            model, input_ids, attention_mask, labels, frozen=DisabledAdapter(), kind=self.divergence, **inputs
        ).mean()


def check_output_kl_trainer(trainer: Any) -> None:
    """Output-KL needs a PEFT model, and the whole head in its loss (not under ZeRO-3 or FSDP)."""
    model = trainer.model
    refuse_under_sharding(trainer, "output_kl_coef > 0", HEAD_OUTSIDE_FORWARD, under_fsdp=True)
    if not hasattr(model, "disable_adapter"):
        raise ValueError(
            f"output_kl_coef > 0 needs a PEFT model (the frozen distribution is the model with its adapters "
            f"disabled), got {type(model).__name__}; pass `peft_config` or a PeftModel"
        )
