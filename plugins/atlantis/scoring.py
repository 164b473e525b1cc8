"""One model's response log-probs over a dataset: exactly the tokens the SFT trainer trains on, batched for speed.

Each model is tokenised with its own tokenizer by TRL's own preparation (`kinfolk.tokens.sft_tokenize`), so
chat templates, EOS and completion / assistant masks match the trainer's; families with different tokenizers
score the same text. Rows are length-sorted into chunks (the cache and multi-process unit) and padded batches
under a token budget, run under `inference_mode` (bf16 autocast on GPU) through TRL's fused LM head
(`kinfolk.logprobs`), which never builds full-vocabulary logits for the whole batch. Only one model is in
memory at a time. Under `accelerate launch`, process p scores chunks p, p + N, ... and every process ends with
the full result.

>>> import tempfile
>>> from kinfolk.testing import TinyKit, prompt_completion_dataset
>>> from kinfolk.plugins.atlantis import ScoreConfig
>>> kit = TinyKit(tempfile.mkdtemp())
>>> scores = score_model(prompt_completion_dataset(4), kit.model_dir("llama"), "small_base",
...                      ScoreConfig(use_cache=False))
>>> scores.logprob.shape, bool((scores.logprob < 0).all())
((4,), True)
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import PartialState
from accelerate.utils import gather_object, parse_flag_from_env
from datasets import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from kinfolk import console
from kinfolk.atomic import fingerprint
from kinfolk.errors import EmptyDatasetError, ScoringError, option, option_name
from kinfolk.logprobs import label_log_probs, pad_right
from kinfolk.plugins.atlantis.batching import (
    chunk_plan,
    chunk_token_budget,
    chunks_for_process,
    token_budget_batches,
)
from kinfolk.plugins.atlantis.cache import (
    ScoreCache,
    dataset_fingerprint,
    default_cache_dir,
    model_fingerprint,
    template_fingerprint,
)
from kinfolk.plugins.atlantis.config import ScoreConfig
from kinfolk.tokens import IGNORE_INDEX, DatasetFormatError, dataset_type, sft_arguments, sft_tokenize

logger = logging.getLogger(__name__)

# Columns TRL's dataset preparation reads (besides the text field).
TEXT_COLUMNS = ("prompt", "completion", "messages", "conversations", "tools", "chat_template_kwargs")


@dataclass
class ModelScores:
    """Per-row results of one model: response log-prob sum (NaN if skipped) and response token count."""

    role: str
    model: str
    logprob: np.ndarray
    tokens: np.ndarray
    skipped: np.ndarray  # bool: rows left unscored (overlong under overlong="skip")

    @property
    def n_skipped(self) -> int:
        return int(self.skipped.sum())


def process_state() -> PartialState:
    """accelerate's process state. On a host without an accelerator, accelerate joins the processes of a launch
    into a gloo group only when asked for the CPU, so ask for it there (otherwise each would score everything)."""
    return PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU") or not torch.accelerator.is_available())


def text_columns(dataset: Dataset, text_field: str = "text") -> list[str]:
    """The columns the SFT preparation reads; refuses a dataset with none (naming expected and present ones)."""
    if "input_ids" in dataset.column_names:
        raise DatasetFormatError(
            "scoring needs the text, since each model tokenises it with its own tokenizer; the dataset is "
            f"already tokenised (columns {sorted(dataset.column_names)})"
        )
    dataset_type(dataset.column_names, text_field)
    return [name for name in (*TEXT_COLUMNS, text_field) if name in dataset.column_names]


_said: set[str] = set()


def _say_once(message: str) -> None:
    """A warning once per process (every model of a run is scored with the same options)."""
    if message not in _said:
        _said.add(message)
        logger.warning(message)


def scoring_sft_args(dataset: Dataset, config: ScoreConfig):
    """SFT options that make the trainer's loss cover the response only (unless the config says otherwise)."""
    kind = dataset_type(dataset.column_names, config.dataset_text_field)
    assistant_only = config.assistant_only_loss
    if assistant_only is None:
        assistant_only = kind == "conversational"
        if assistant_only:
            _say_once(
                "messages data: scoring the assistant turns only (the responses ATLANTIS weighs), while SFTTrainer "
                f"trains every token unless told {option('assistant_only_loss')}; train with that option to train "
                f"on what was scored, or score with {option('assistant_only_loss', False)} to score every token"
            )
    return sft_arguments(
        completion_only_loss=config.completion_only_loss,
        assistant_only_loss=assistant_only,
        dataset_text_field=config.dataset_text_field,
    )


def resolve_precision(dtype: str, device: torch.device) -> tuple[torch.dtype, torch.dtype | None]:
    """(dtype the weights load in, autocast dtype or None): bf16 with autocast on a capable GPU for 'auto'."""
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16, torch.bfloat16
        return torch.float32, None
    load = getattr(torch, dtype)
    return load, (load if device.type == "cuda" and load != torch.float32 else None)


def context_length(model_path: str | Path, config: ScoreConfig) -> int | None:
    if config.max_length is not None:
        return config.max_length
    model_config = AutoConfig.from_pretrained(model_path).get_text_config()
    return getattr(model_config, "max_position_embeddings", None)


def response_token_counts(labels: Sequence[Sequence[int]]) -> np.ndarray:
    """Tokens the trainer's shifted loss covers: labels after the first position that are not ignored."""
    return np.array([sum(label != IGNORE_INDEX for label in row[1:]) for row in labels], dtype=np.int64)


def _rows_text(rows: Sequence[int], limit: int = 10) -> str:
    rows = [int(row) for row in rows]
    return str(rows[:limit])[:-1] + (f", ... ({len(rows)} rows)]" if len(rows) > limit else "]")


def score_batches(
    model: PreTrainedModel,
    input_ids: Sequence[Sequence[int]],
    labels: Sequence[Sequence[int]],
    batches: Sequence[Sequence[int]],
    pad_token_id: int,
    autocast_dtype: torch.dtype | None = None,
) -> Iterator[tuple[list[int], np.ndarray, np.ndarray]]:
    """Yield `(rows, log-prob sums (float64), token counts)` for each batch of row indices."""
    device = next(model.parameters()).device
    autocast = (
        torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
    )
    for rows in batches:
        batch = pad_right([input_ids[row] for row in rows], [labels[row] for row in rows], pad_token_id)
        # Right padding under causal attention: a real token never sees the padding after it, and padded positions
        # carry no label, so no attention mask is needed; without one, SDPA takes its fused causal kernel instead
        # of materialising a (batch, heads, T, T) mask.
        with torch.inference_mode(), autocast:
            log_probs, mask = label_log_probs(
                model, batch["input_ids"].to(device, non_blocking=True), None, batch["labels"].to(device)
            )
            sums = log_probs.double().sum(dim=-1)
        yield list(rows), sums.cpu().numpy(), mask.sum(dim=-1).cpu().numpy()


def load_model(model_path: str | Path, config: ScoreConfig, device: torch.device) -> PreTrainedModel:
    load_dtype, _ = resolve_precision(config.dtype, device)
    kwargs: dict[str, Any] = {"dtype": load_dtype}
    if config.attn_implementation:
        kwargs["attn_implementation"] = config.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
    return model.to(device).eval()


def _check_finite(rows: list[int], sums: np.ndarray, role: str, model_path: str | Path) -> None:
    bad = ~np.isfinite(sums)
    if bad.any():
        row = rows[int(np.argmax(bad))]
        raise ScoringError(
            f"{role} model {model_path} gave a non-finite log-prob ({sums[bad][0]}) for row {row}"
            + (f" and {int(bad.sum()) - 1} more rows in its batch" if bad.sum() > 1 else "")
            + "; check the model's weights, or load it in float32 (dtype='float32')"
        )


@dataclass
class TokenizedRows:
    """One model's view of a dataset: its tokens, what it scores, and which rows it must leave out."""

    role: str
    model_path: str
    tokenizer: PreTrainedTokenizerBase
    input_ids: list[list[int]]
    labels: list[list[int]]
    lengths: np.ndarray
    response_tokens: np.ndarray
    skipped: np.ndarray
    context: int | None


def tokenize_rows(text: Dataset, model_path: str, role: str, config: ScoreConfig, sft_args) -> TokenizedRows:
    """Tokenise `text` with the model's own tokenizer as the SFT trainer would, refusing rows it cannot score."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    try:
        tokens = sft_tokenize(text, tokenizer, sft_args)
    except DatasetFormatError as error:
        raise DatasetFormatError(f"{role} model {model_path}: {error}") from error
    except ValueError as error:  # TRL's own refusals, e.g. a chat template it cannot mask for assistant_only_loss
        hint = ""
        if sft_args.assistant_only_loss and config.assistant_only_loss is None:
            hint = (
                f"; scoring defaults to {option('assistant_only_loss')} for conversations: pass "
                f"{option('assistant_only_loss', False)} to score every token, as SFTTrainer does by default"
            )
        raise DatasetFormatError(f"{role} model {model_path}: {error}{hint}") from error
    input_ids, labels = tokens["input_ids"], tokens["labels"]
    lengths = np.array([len(ids) for ids in input_ids], dtype=np.int64)
    response_tokens = response_token_counts(labels)
    empty = np.flatnonzero(response_tokens == 0)
    if empty.size:
        raise ScoringError(
            f"rows {_rows_text(empty)} have no response tokens for {role} model {model_path} (empty completion "
            "or no assistant turn); remove them before scoring"
        )
    limit = context_length(model_path, config)
    overlong = np.flatnonzero(lengths > limit) if limit is not None else np.array([], dtype=np.int64)
    if overlong.size and config.overlong == "error":
        raise ScoringError(
            f"rows {_rows_text(overlong)} are longer than {role} model {model_path}'s context of {limit} tokens "
            f"(longest {int(lengths[overlong].max())}); pass {option('overlong', 'skip')} to leave them unscored, or "
            f"a larger {option_name('max_length')}"
        )
    skipped = np.zeros(len(text), dtype=bool)
    skipped[overlong] = True
    return TokenizedRows(role, model_path, tokenizer, input_ids, labels, lengths, response_tokens, skipped, limit)


def score_model(
    dataset: Dataset,
    model_path: str | Path,
    role: str,
    config: ScoreConfig,
    state: PartialState | None = None,
    after_chunk: Callable[[int], None] | None = None,
) -> ModelScores:
    """Score every row of `dataset` with the model at `model_path`; `role` names it in messages and progress.

    `after_chunk(chunk_index)` is called after each newly computed chunk is cached (used by tests to interrupt).
    """
    if len(dataset) == 0:
        raise EmptyDatasetError(f"the dataset to score with the {role} model {model_path} has no rows")
    state = state or process_state()
    model_path = str(model_path)
    columns = text_columns(dataset, config.dataset_text_field)
    text = dataset.select_columns(columns)
    sft_args = scoring_sft_args(dataset, config)
    rows = tokenize_rows(text, model_path, role, config, sft_args)
    scored_rows = np.flatnonzero(~rows.skipped)
    budget = chunk_token_budget(int(rows.lengths[scored_rows].sum()), config.tokens_per_batch, config.chunk_tokens)
    plan = chunk_plan(rows.lengths, config.chunk_rows, rows=scored_rows, chunk_tokens=budget)
    cache = None
    if config.use_cache:
        key = fingerprint(
            model_fingerprint(model_path),
            dataset_fingerprint(text, columns),
            template_fingerprint(rows.tokenizer, sft_args),
            [str(dtype) for dtype in resolve_precision(config.dtype, state.device)],
            config.attn_implementation,
            rows.context,
            ["chunks", budget, config.chunk_rows],
        )
        meta = {"role": role, "model": model_path, "rows": len(dataset), "chunks": len(plan)}
        cache = ScoreCache(config.cache_dir or default_cache_dir(), key, meta)

    mine = chunks_for_process(len(plan), state.process_index, state.num_processes)
    results, error = [], None
    try:
        results = _score_chunks(rows, plan, mine, config, state, cache, after_chunk)
    except Exception as exc:  # other processes must learn of it, or they wait forever in the gather
        error = exc
    gathered = gather_object([(state.process_index, repr(error) if error else None, results)])
    if error is not None:
        raise error
    failures = [(index, message) for index, message, _ in gathered if message]
    if failures:
        raise ScoringError(
            f"process {failures[0][0]} failed while scoring {role} model {model_path}: {failures[0][1]}"
        )

    logprob = np.full(len(dataset), np.nan, dtype=np.float64)
    for _, _, chunks in gathered:
        for chunk_rows, sums in chunks:
            logprob[chunk_rows] = sums
    return ModelScores(role, model_path, logprob, rows.response_tokens, rows.skipped)


def _score_chunks(
    rows: TokenizedRows,
    plan: list[np.ndarray],
    mine: list[int],
    config: ScoreConfig,
    state: PartialState,
    cache: ScoreCache | None,
    after_chunk: Callable[[int], None] | None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """This process's chunks: read from the cache when present, otherwise computed (then cached)."""
    results, pending = [], []
    for chunk in mine:
        stored = cache.read(chunk, expected_rows=plan[chunk]) if cache is not None else None
        if stored is None:
            pending.append(chunk)
        else:
            results.append((stored["rows"], stored["logprob"]))
    if len(pending) < len(mine) and state.is_main_process:
        cached_rows = sum(len(plan[chunk]) for chunk in mine if chunk not in pending)
        console.stage(
            f"resuming: {cached_rows:,} of {sum(len(plan[chunk]) for chunk in mine):,} rows scored with the "
            f"{rows.role} model {rows.model_path} (from the score cache)",
            "kinfolk score",
        )
    if not pending:
        return results
    model = load_model(rows.model_path, config, state.device)
    _, autocast_dtype = resolve_precision(config.dtype, state.device)
    tokenizer = rows.tokenizer
    pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0
    total = int(sum(rows.lengths[plan[chunk]].sum() for chunk in pending))
    progress = console.bar(
        total=total, unit="tok", unit_scale=True, desc=f"scoring {rows.role}", disable=not state.is_main_process
    )
    try:
        for chunk in pending:
            batches = token_budget_batches(plan[chunk], rows.lengths, config.tokens_per_batch)
            done, sums_done = [], []
            for batch, sums, _ in score_batches(
                model, rows.input_ids, rows.labels, batches, pad_token_id, autocast_dtype
            ):
                _check_finite(batch, sums, rows.role, rows.model_path)
                done.extend(batch)
                sums_done.append(sums)
                progress.update(int(rows.lengths[batch].sum()))
            done_array, sums_array = np.asarray(done, dtype=np.int64), np.concatenate(sums_done)
            if cache is not None:
                cache.write(chunk, rows=done_array, logprob=sums_array, process=np.int64(state.process_index))
            results.append((done_array, sums_array))
            if after_chunk is not None:
                after_chunk(chunk)
    finally:
        progress.close()
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return results
