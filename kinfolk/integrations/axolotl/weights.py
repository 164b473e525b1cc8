"""ATLANTIS example weights through axolotl's data pipeline: from a dataset column to per-token loss weights.

axolotl tokenises each dataset with a prompt strategy whose `dataset.map` removes every original column
(`axolotl.datasets.TokenizedPromptDataset.process`), so the weight column would not survive it. While the plugin
loads the data, `carrying_weights` wraps the strategy so that each tokenised row keeps its source row's weight, after
checking the column as `kinfolk sft` does (`WeightTransform.fit`: missing, negative, non-finite, all zero: one line,
before any model loads). `with_token_weights` then writes the example weight and the prompt/completion split on every
token of the prepared rows (`token_weight_columns`), and `WeightedSeq2SeqCollator` turns them into the batch's
`loss_weights`, `token_mass` and `weight_stats` (`WeightedCollator`), all as `WeightedSFTTrainer` builds them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import axolotl.utils.data  # noqa: F401  before axolotl.datasets, which cannot be imported first (axolotl's own circle)
from axolotl.datasets import TokenizedPromptDataset
from axolotl.utils.collators import DataCollatorForSeq2Seq
from datasets import Dataset

from kinfolk.errors import InputError, WeightColumnError
from kinfolk.integrations.axolotl.args import KinfolkOptions
from kinfolk.trainers.weighted_sft_data import TOKEN_COLUMNS, WeightedCollator, WeightTransform, token_weight_columns


class _WeightKeepingStrategy:
    """An axolotl prompt strategy whose tokenised rows keep their source row's weight (one row in, one row out)."""

    def __init__(self, strategy: Any, column: str):
        self._strategy = strategy
        self._column = column

    def __getattr__(self, name: str) -> Any:  # filter_rows, supports_batched, ... stay the strategy's
        if name.startswith("_"):  # unpickling in a worker process asks before `_strategy` is set
            raise AttributeError(name)
        return getattr(self._strategy, name)

    def tokenize_prompt(self, prompt: dict[str, Any]) -> dict[str, Any]:
        tokenized = dict(self._strategy.tokenize_prompt(prompt))
        weights = prompt[self._column]
        if self._strategy.supports_batched:
            rows = len(tokenized["input_ids"])
            if rows != len(weights):
                raise InputError(
                    f"the prompt strategy {type(self._strategy).__name__} turns {len(weights)} rows into {rows}: "
                    f"kinfolk.weight_column {self._column!r} needs one tokenised row per dataset row"
                )
        tokenized[self._column] = weights
        return tokenized


@contextlib.contextmanager
def carrying_weights(options: KinfolkOptions) -> Iterator[None]:
    """While axolotl loads and tokenises its datasets, check each one's weight column and keep it on the tokens."""
    original = TokenizedPromptDataset.process
    column = options.weight_column

    def process(self, dataset):
        WeightTransform.fit(dataset, column, options.weight_clip_min, options.weight_clip_max, False, "axolotl")
        self.prompt_tokenizer = _WeightKeepingStrategy(self.prompt_tokenizer, column)
        return original(self, dataset)

    TokenizedPromptDataset.process = process
    try:
        yield
    finally:
        TokenizedPromptDataset.process = original


def with_token_weights(dataset: Dataset, options: KinfolkOptions, dataset_name: str, weighted: bool) -> Dataset:
    """The prepared rows with the per-token weight columns: the example weights of `weight_column` (clipped and, with
    `normalize_weights`, scaled to mean 1 over these rows) where `weighted`, else weight 1 for every example."""
    transform = None
    if weighted and options.weight_column is not None:
        if options.weight_column not in dataset.column_names:
            raise WeightColumnError(
                f"the prepared {dataset_name} dataset has no weight column {options.weight_column!r} (columns "
                f"{sorted(dataset.column_names)}): it was prepared without kinfolk's plugin; remove axolotl's "
                "dataset_prepared_path folder so that it is prepared again"
            )
        transform = WeightTransform.fit(
            dataset,
            options.weight_column,
            options.weight_clip_min,
            options.weight_clip_max,
            options.normalize_weights,
            dataset_name,
        )
    return dataset.map(
        token_weight_columns,
        with_indices=True,
        fn_kwargs={"transform": transform, "prompt_loss_weight": options.prompt_loss_weight},
        desc=f"Writing example weights on the tokens of the {dataset_name} dataset",
    )


@dataclass
class _WithoutWeightColumns:
    """axolotl's collator given only the columns it pads: the per-token weight columns go to `WeightedCollator`."""

    collator: DataCollatorForSeq2Seq
    padding_free: bool = False

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        return self.collator([{k: v for k, v in row.items() if k not in TOKEN_COLUMNS} for row in examples])


class WeightedSeq2SeqCollator(WeightedCollator):
    """axolotl's `DataCollatorForSeq2Seq` (same arguments) plus `loss_weights`, `token_mass` and `weight_stats`."""

    def __init__(self, tokenizer, **kwargs):
        if tokenizer.padding_side != "right":
            raise InputError(
                f"kinfolk's example weights line up with right-padded labels; the tokenizer pads on the "
                f"{tokenizer.padding_side}"
            )
        super().__init__(_WithoutWeightColumns(DataCollatorForSeq2Seq(tokenizer, **kwargs)))
