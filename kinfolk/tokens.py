"""Which tokens a TRL `SFTTrainer` trains on, computed without building a trainer.

`sft_tokenize` runs TRL's own dataset preparation (`SFTTrainer._prepare_dataset`, wrapped here so a TRL
upgrade breaks one place) on a stand-in for the trainer, so the chat template, the EOS appended to
non-conversational text, the completion / assistant masks and the prompt-boundary rule are exactly the
trainer's. Rows stay in order and none are dropped: scoring needs one result per input row, so truncation
is left to the caller (see `overlong_rows`).

>>> from kinfolk.testing import build_tokenizer, prompt_completion_dataset
>>> tokens = sft_tokenize(prompt_completion_dataset(2), build_tokenizer())
>>> sorted(tokens.column_names)
['completion', 'input_ids', 'labels', 'prompt']
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from datasets import Dataset
from transformers import PreTrainedTokenizerBase
from trl import SFTConfig, SFTTrainer
from trl.chat_template_utils import get_training_chat_template, has_generation_markers
from trl.data_utils import is_conversational

from kinfolk.errors import DatasetFormatError, EmptyDatasetError

IGNORE_INDEX = -100

# Columns each dataset type must provide, as TRL reads them.
DATASET_TYPES = {
    "language modeling": ("text",),
    "conversational": ("messages",),
    "prompt-completion": ("prompt", "completion"),
}


@dataclasses.dataclass
class _TrainerStandIn:
    """The attributes `SFTTrainer._prepare_dataset` reads from the trainer."""

    _tokenizer: PreTrainedTokenizerBase
    completion_only_loss: bool
    chat_template: str | None


def _sft_defaults() -> SimpleNamespace:
    """SFTConfig's field defaults without instantiating it (its validation needs a device and an output dir)."""
    return SimpleNamespace(
        **{
            field.name: field.default if field.default is not dataclasses.MISSING else field.default_factory()
            for field in dataclasses.fields(SFTConfig)
            if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        }
    )


def sft_arguments(**overrides: Any) -> SimpleNamespace:
    """SFTConfig's defaults with `overrides` applied, for `sft_tokenize` (no device or output dir needed)."""
    args = _sft_defaults()
    unknown = sorted(set(overrides) - set(vars(args)))
    if unknown:
        raise TypeError(f"not SFTConfig fields: {unknown}")
    vars(args).update(overrides)
    return args


def dataset_type(column_names: list[str], text_field: str = "text") -> str:
    """Name the SFT dataset type from its columns, or raise naming the expected and present columns."""
    columns = set(column_names)
    if {"prompt", "completion"} <= columns:
        return "prompt-completion"
    if "messages" in columns or "conversations" in columns:
        return "conversational"
    if text_field in columns:
        return "language modeling"
    expected = "; ".join(" + ".join(cols) for cols in DATASET_TYPES.values())
    raise DatasetFormatError(
        f"the dataset has none of the SFT column sets ({expected}, or text field {text_field!r}); "
        f"columns present: {sorted(columns)}"
    )


def sft_tokenize(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    args: SFTConfig | SimpleNamespace | None = None,
    dataset_name: str = "scored",
) -> Dataset:
    """Tokenise `dataset` as `SFTTrainer(args=args)` would, keeping every row in order and untruncated.

    Returns the original columns, unchanged, plus `input_ids` and `labels` (`-100` where the trainer computes no loss).
    `args` supplies `completion_only_loss`, `assistant_only_loss`, `dataset_text_field`, `eos_token`,
    `dataset_num_proc`; packing, shuffling and truncation are switched off.
    """
    args = args or _sft_defaults()
    kind = dataset_type(dataset.column_names, args.dataset_text_field)
    if len(dataset) == 0:  # TRL would stop on a bare StopIteration reading the first row
        raise EmptyDatasetError(f"the {dataset_name} dataset has no rows (columns {sorted(dataset.column_names)})")
    first = dataset[0]
    if kind != "language modeling" and is_conversational(first) and tokenizer.chat_template is None:
        raise DatasetFormatError(
            f"the dataset is conversational (columns {sorted(dataset.column_names)}) but the tokenizer "
            f"{type(tokenizer).__name__} ({getattr(tokenizer, 'name_or_path', '')!r}) has no chat template"
        )
    prepared_args = SimpleNamespace(**vars(args))
    prepared_args.__dict__.update(packing=False, shuffle_dataset=False, max_length=None)
    if args.eos_token is not None:
        tokenizer.eos_token = args.eos_token
    chat_template = None
    if args.assistant_only_loss and not has_generation_markers(tokenizer.chat_template):
        chat_template = get_training_chat_template(tokenizer)
    completion_only = args.completion_only_loss
    if completion_only is None:
        completion_only = kind == "prompt-completion"
    stand_in = _TrainerStandIn(tokenizer, completion_only, chat_template)
    prepared = SFTTrainer._prepare_dataset(
        stand_in, dataset, tokenizer, prepared_args, packing=False, formatting_func=None, dataset_name=dataset_name
    )
    if "input_ids" in dataset.column_names:
        return prepared
    # TRL rewrites text columns in place (it appends EOS to `completion` / `text`); hand back the user's own.
    return dataset.add_column("input_ids", prepared["input_ids"]).add_column("labels", prepared["labels"])


def overlong_rows(tokenized: Dataset, max_length: int) -> list[int]:
    """Indices of rows longer than `max_length` tokens (the trainer would truncate them)."""
    lengths = [len(ids) for ids in tokenized["input_ids"]]
    return [row for row, length in enumerate(lengths) if length > max_length]


def response_text(example: dict[str, Any], text_field: str = "text") -> str:
    """The text a response-level score is about: the completion, the assistant turns, or the whole text.

    Its UTF-8 byte count is tokenizer-independent, which is what makes per-byte normalised scores of models
    with different tokenizers comparable.
    """
    if "completion" in example:
        completion = example["completion"]
        return completion if isinstance(completion, str) else "".join(m["content"] for m in completion)
    if "messages" in example:
        return "".join(m["content"] for m in example["messages"] if m["role"] == "assistant")
    if text_field in example:
        return example[text_field]
    raise DatasetFormatError(f"cannot find a response in a row with keys {sorted(example)}")


def response_bytes(example: dict[str, Any], text_field: str = "text") -> int:
    return len(response_text(example, text_field).encode("utf-8"))
