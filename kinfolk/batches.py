"""Fixed measurement batches: retained contexts tokenised exactly as `SFTTrainer` would, padded, longest first.

Used wherever a model is run over a fixed set of contexts rather than trained on them: the retained-KL callback, the
Output-KL regulariser's reference passes and fitting an ATLAS atlas.

>>> from kinfolk.testing import build_tokenizer, prompt_completion_dataset
>>> batches = retained_batches(prompt_completion_dataset(5), build_tokenizer(), batch_size=2)
>>> [batch["input_ids"].shape[0] for batch in batches]
[2, 2, 1]
"""

from __future__ import annotations

import torch
from datasets import Dataset

from kinfolk.errors import DatasetFormatError, EmptyDatasetError
from kinfolk.logprobs import pad_right
from kinfolk.tokens import sft_tokenize

POSITIONS = ("response", "all")


def retained_batches(
    dataset: Dataset,
    tokenizer,
    positions: str = "response",
    max_length: int | None = 1024,
    batch_size: int = 8,
    sft_args=None,
    dataset_name: str = "retained",
) -> list[dict[str, torch.Tensor]]:
    """Padded CPU batches (`input_ids`, `attention_mask`, `labels`) of `dataset`, rows cut to `max_length` tokens.

    An SFT-format dataset is tokenised with `kinfolk.tokens.sft_tokenize` (`sft_args`: the trainer's SFT options);
    one that already has `input_ids` is used as is; `dataset_name` names it in the progress bar and errors.
    `positions="response"` keeps the `labels` (-100 outside the tokens the trainer trains on); `"all"` labels every
    token. Rows are sorted longest first: less padding per batch, and a batch too large for memory fails on the
    first step.
    """
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
    if len(dataset) == 0:  # before tokenising: TRL stops on a bare StopIteration reading the first row
        raise EmptyDatasetError(f"the retained dataset has no rows (columns {sorted(dataset.column_names)})")
    if "input_ids" not in dataset.column_names:
        if tokenizer is None:
            raise ValueError(
                f"the retained dataset of raw text (columns {dataset.column_names}) needs `tokenizer=` to tokenise"
            )
        dataset = sft_tokenize(dataset, tokenizer, sft_args, dataset_name=dataset_name)
    if positions == "response" and "labels" not in dataset.column_names:
        raise DatasetFormatError(
            "positions='response' needs `labels` (-100 outside the response) in a pre-tokenised retained dataset; "
            "pass positions='all' or an SFT-format dataset"
        )
    rows = []
    all_labels = dataset["labels"] if positions == "response" else dataset["input_ids"]
    for index, (ids, labels) in enumerate(zip(dataset["input_ids"], all_labels)):
        if len(labels) != len(ids):
            raise DatasetFormatError(f"retained row {index}: {len(ids)} input_ids but {len(labels)} labels")
        rows.append((list(ids[:max_length]), list(labels[:max_length])))
    empty = [index for index, (ids, _) in enumerate(rows) if not ids]
    if empty:
        raise DatasetFormatError(f"retained dataset rows {empty[:10]} have no tokens")
    rows.sort(key=lambda row: -len(row[0]))
    pad_id = getattr(tokenizer, "pad_token_id", None)
    pad_id = 0 if pad_id is None else pad_id
    return [
        pad_right(
            [ids for ids, _ in rows[start : start + batch_size]],
            [labels for _, labels in rows[start : start + batch_size]],
            pad_id,
        )
        for start in range(0, len(rows), batch_size)
    ]
