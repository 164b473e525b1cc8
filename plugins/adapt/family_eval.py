"""Every size of a family measured on the same examples: the outcomes file `kinfolk route` reads.

A family is a folder of sizes, each a model folder (`kinfolk merge patch --all` writes `k0/ ... kM/` and
`family.json`, whose order is kept; without it every sub-folder is a size). Each example gets one row per size
(`split`, `id`, `model`, `correct`, `tokens`, and `level` and `prompt` where known), from one of two measurements:

- an lm-eval task (`sample_outcomes`, from the per-sample log of each size's run): `correct` is the task's metric
  on that example (`acc`, `exact_match`, ...), `tokens` what its requests ran through the size (context and
  continuation of every option of a multiple-choice question; context and generated answer of a generation), and
  `prompt` the first request's context;
- held-out perplexity on a local file (`heldout_outcomes`): `text` rows, `prompt` and `completion` (only the
  completion scored) or `messages`, tokenised as `SFTTrainer` would (`kinfolk.tokens.sft_tokenize`), with
  `rated_prompt` as the `prompt` (a chat row's turns before its answer). `nll` is the example's
  summed negative log-likelihood over its `scored_tokens`, and `correct` = exp(−nll / scored_tokens), the geometric
  mean probability of its tokens: a continuous score in (0, 1], higher for the better size, that route's accuracy
  thresholds (0 … 1) apply to as they do to 0/1 correctness.

`level` comes from the data's `level` column (or the one named): lm-eval's `doc` or the held-out row. Without it
route rates each `prompt` (`kinfolk route --difficulty rating`). `split_examples` sends each example to the
calibration or the test split at random (seeded), level by level, so every level of the test split has calibration
examples; `write_outcomes` checks that every example has one outcome per size and writes the file whole.

>>> split_examples({"a": 1, "b": 1, "c": 1, "d": 2, "e": 2}, calibration_share=0.5, seed=0)
{'a': 'calibration', 'b': 'test', 'c': 'calibration', 'd': 'test', 'e': 'calibration'}
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kinfolk.atomic import atomic_file, check_destination
from kinfolk.errors import DatasetFormatError, EmptyDatasetError, InputError, MissingInputError, ModelInputError
from kinfolk.inputs import check_model, read_json, read_json_lines

FAMILY_FILE = "family.json"  # what `kinfolk merge patch --all` writes beside its sizes
DEFAULT_LEVEL_FIELD = "level"
SPLITS = ("calibration", "test")


@dataclass(frozen=True)
class Size:
    """One size of a family: its folder's name (the `model` of its outcomes) and path."""

    name: str
    path: Path


@dataclass(frozen=True)
class ExampleOutcome:
    """One example on one size: a row of the outcomes file, less its split."""

    id: str
    model: str
    correct: float
    tokens: int
    level: Any = None
    prompt: str | None = None
    nll: float | None = None
    scored_tokens: int | None = None

    def row(self, split: str) -> dict[str, Any]:
        fields = {"split": split, **vars(self)}
        return {name: value for name, value in fields.items() if value is not None}


@dataclass(frozen=True)
class OutcomesWritten:
    """What `write_outcomes` wrote: examples per split, whether they carry levels, and each size's mean `correct`
    per split (and its mean per-token loss where every outcome has one: held-out perplexity)."""

    path: Path
    examples: dict[str, int]
    levels: bool
    mean_correct: dict[str, dict[str, float]]
    mean_loss: dict[str, dict[str, float]] | None = None


def family_sizes(directory: str | Path) -> list[Size]:
    """The sizes of the family in `directory`: the folders `family.json` lists, in its order, else every
    sub-folder by name. Each must be a loadable model folder (config, weights, tokenizer)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise MissingInputError(f"--family {directory}: no such directory", path=directory)
    if (directory / FAMILY_FILE).is_file():
        listed = read_json(directory / FAMILY_FILE, "family file").get("models", [])
        names = [str(entry["dir"]) for entry in listed if isinstance(entry, dict) and entry.get("dir")]
    else:
        names = sorted(path.name for path in directory.iterdir() if path.is_dir() and not path.name.startswith("."))
    if not names:
        raise ModelInputError(f"--family {directory} holds no size folders (nor a {FAMILY_FILE} listing them)")
    sizes = [Size(name, directory / name) for name in names]
    for size in sizes:
        check_model(size.path, "--family size", tokenizer=True)
    return sizes


def example_levels(docs: Sequence[dict], level_field: str | None, names: Sequence[str]) -> list:
    """Each doc's level: `level_field`'s value, required in every doc when named; by default the `level` column
    where every doc has one, else None for all. `names` names the docs in errors."""
    field = level_field or DEFAULT_LEVEL_FIELD
    present = [doc.get(field) is not None for doc in docs]
    if level_field is None and not any(present):
        return [None] * len(docs)
    for doc_name, has_level in zip(names, present):
        if not has_level:
            raise DatasetFormatError(f"{doc_name} has no {field!r} (the difficulty level; --level_field names it)")
    return [doc[field] for doc in docs]


def _device(device: str | None) -> str:
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def chat_template_note(data: str | Path) -> str:
    """Whether held-out rows are scored through each size's chat template, in a line the eval prints: rows in chat
    form (`messages`, or `prompt` / `completion` given as role/content lists) are, as `SFTTrainer` trains on them;
    plain `text` or string `prompt` / `completion` rows are scored as written. The two forms of one text score
    far apart (the template adds the turns a chat model expects), so the reader must know which was measured."""
    from trl.data_utils import is_conversational

    from kinfolk.data import load_data

    if is_conversational(load_data(data)[0]):
        return f"{data}: chat rows, scored through each size's chat template (as SFTTrainer trains on them)"
    return (
        f"{data}: plain rows, scored as written without a chat template (rows of role/content messages would be "
        "scored through it)"
    )


def rated_prompt(row: dict[str, Any], kind: str) -> str:
    """What `kinfolk route --difficulty rating` shows its rater of a held-out row: a text row's text, a prompt as
    written, or a conversation's turns before its last answer (each turn's content on its own line).

    >>> rated_prompt({"messages": [{"role": "user", "content": "Spell 42"}, {"role": "assistant", "content": "four two"}]},
    ...              "conversational")
    'Spell 42'
    >>> rated_prompt({"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Hello"}]},
    ...              "prompt-completion")
    'Hi'
    """
    if kind == "language modeling":
        return row["text"]
    if kind == "prompt-completion":
        turns = row["prompt"]
    else:
        answers = [index for index, turn in enumerate(row["messages"]) if turn.get("role") == "assistant"]
        turns = row["messages"][: answers[-1]] if answers else row["messages"]
    return turns if isinstance(turns, str) else "\n".join(str(turn["content"]) for turn in turns)


def heldout_outcomes(
    sizes: Sequence[Size],
    data: str | Path,
    *,
    level_field: str | None = None,
    batch_size: int = 8,
    device: str | None = None,
) -> list[ExampleOutcome]:
    """Per size and row of `data` (a local .jsonl/.json/.txt/.parquet/.csv file): the NLL of its scored tokens
    and the per-token probability exp(−NLL / scored tokens) as `correct`. Rows are `text`, or `prompt` and
    `completion` (only the completion scored); `id` names a row where present (else its 1-based number)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kinfolk.data import load_data, naming
    from kinfolk.logprobs import pad_right, sequence_log_probs
    from kinfolk.tokens import DATASET_TYPES, dataset_type, sft_tokenize

    dataset = load_data(data)
    with naming(data):
        kind = dataset_type(dataset.column_names)
    rows = dataset.to_list()
    for number, row in enumerate(rows, start=1):
        absent = [name for name in DATASET_TYPES[kind] if row.get(name) is None]
        if absent:
            raise DatasetFormatError(f"{data}: row {number} has no {', '.join(map(repr, absent))}", path=data)
    ids = [str(row["id"]) if row.get("id") is not None else str(number) for number, row in enumerate(rows, start=1)]
    if len(set(ids)) != len(ids):
        repeated = next(example for example in ids if ids.count(example) > 1)
        raise DatasetFormatError(f"{data}: id {repeated!r} names two rows", path=data)
    levels = example_levels(rows, level_field, [f"{data}: row {number}" for number in range(1, len(rows) + 1)])
    prompts = [rated_prompt(row, kind) for row in rows]
    outcomes = []
    for size in sizes:
        tokenizer = AutoTokenizer.from_pretrained(size.path)  # each size's own: a family may differ in tokenizer
        with naming(data):
            tokenized = sft_tokenize(dataset, tokenizer, dataset_name=str(data))
        input_ids, labels = list(tokenized["input_ids"]), list(tokenized["labels"])
        model = AutoModelForCausalLM.from_pretrained(size.path, dtype="auto").to(_device(device)).eval()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0  # masked out either way
        for start in range(0, len(rows), batch_size):
            batch = pad_right(input_ids[start : start + batch_size], labels[start : start + batch_size], pad)
            with torch.inference_mode():
                batch = {name: tensor.to(model.device) for name, tensor in batch.items()}
                sums, counts = sequence_log_probs(model, batch["input_ids"], batch["attention_mask"], batch["labels"])
            for offset, (log_prob, count) in enumerate(zip(sums.tolist(), counts.tolist())):
                row = start + offset
                if count == 0:
                    raise DatasetFormatError(f"{data}: row {row + 1} has no token to score", path=data)
                outcomes.append(
                    ExampleOutcome(
                        id=ids[row],
                        model=size.name,
                        correct=math.exp(log_prob / count),
                        tokens=len(input_ids[row]),
                        level=levels[row],
                        prompt=prompts[row],
                        nll=-log_prob,
                        scored_tokens=int(count),
                    )
                )
        del model
    return outcomes


def read_sample_logs(directory: str | Path) -> dict[str, list[dict]]:
    """lm-eval's per-sample logs under `directory` (`--log_samples`: samples_<task>_<date>.jsonl), per task."""
    logs = {}
    for path in sorted(Path(directory).rglob("samples_*.jsonl")):
        task = path.stem.removeprefix("samples_").rsplit("_", 1)[0]
        logs[task] = read_json_lines(path, "lm-eval samples file", entry="a sample record (a JSON object)")
    if not logs:
        raise EmptyDatasetError(f"lm-eval wrote no sample logs under {directory}")
    return logs


def _requests(record: dict[str, Any]) -> list[tuple[str, str]]:
    """(context, what ran through the model) of each request of a sample record: context + continuation
    (log-likelihood), context + generated answer (generation), or the context alone (rolling log-likelihood)."""
    arguments = record["arguments"]
    if isinstance(arguments, dict):  # as lm-eval saves them: {"gen_args_0": {"arg_0": ..., "arg_1": ...}, ...}
        arguments = [list(arguments[f"gen_args_{i}"].values()) for i in range(len(arguments))]
    requests = []
    for request, (context, *rest) in enumerate(arguments):
        if rest and isinstance(rest[0], str):
            requests.append((context, context + rest[0]))
        elif rest and isinstance(rest[0], dict):  # generation keywords: the answer is the response
            requests.append((context, context + str(record["resps"][request][0])))
        else:
            requests.append((context, context))
    return requests


def _one_filter(task: str, records: list[dict], filter_name: str | None) -> list[dict]:
    filters = sorted({record.get("filter", "none") for record in records})
    if filter_name is None and len(filters) > 1:
        raise InputError(f"task {task}'s samples carry filters {filters}; choose one with --outcome_filter")
    if filter_name is not None and filter_name not in filters:
        raise InputError(f"--outcome_filter {filter_name!r}: task {task}'s samples carry filters {filters}")
    chosen = filter_name or filters[0]
    return [record for record in records if record.get("filter", "none") == chosen]


def sample_outcomes(
    size: Size,
    logs: dict[str, list[dict]],
    *,
    metric: str | None = None,
    filter_name: str | None = None,
    level_field: str | None = None,
) -> list[ExampleOutcome]:
    """Per example of each task's sample log (`read_sample_logs`) of one size: `metric` (default: the task's
    first) as `correct`, and the tokens of its requests under the size's tokenizer. Examples are `task/doc_id`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(size.path)
    outcomes = []
    for task, records in sorted(logs.items()):
        chosen = _one_filter(task, records, filter_name)
        names = [f"task {task} doc_id {record.get('doc_id')}" for record in chosen]
        levels = example_levels([record.get("doc") or {} for record in chosen], level_field, names)
        for record, name, level in zip(chosen, names, levels):
            scored = metric or next(iter(record.get("metrics") or []), None)
            if scored is None or scored not in record:
                raise InputError(f"{name} has no metric {scored!r} (it has {record.get('metrics')}); --outcome_metric")
            try:
                value = float(record[scored])
            except (TypeError, ValueError):
                raise InputError(f"{name}: metric {scored!r} is {record[scored]!r}, not a number") from None
            requests = _requests(record)
            tokens = sum(len(tokenizer(ran, add_special_tokens=False)["input_ids"]) for _, ran in requests)
            prompt = requests[0][0]
            outcomes.append(ExampleOutcome(f"{task}/{record['doc_id']}", size.name, value, tokens, level, prompt))
    return outcomes


def split_examples(levels: dict[str, Any], calibration_share: float = 0.5, seed: int = 0) -> dict[str, str]:
    """Example id → `calibration` or `test`: per level (in order of first appearance), a seeded shuffle of its
    examples, the first round(share × n) to calibration, at least one to each split where the level has two."""
    if not 0 < calibration_share < 1:
        raise InputError(f"--calibration_share must lie strictly between 0 and 1, got {calibration_share}")
    rng = np.random.default_rng(seed)
    by_level: dict[Any, list[str]] = {}
    for example, level in levels.items():
        by_level.setdefault(level, []).append(example)
    splits = {}
    for examples in by_level.values():
        shuffled = [examples[i] for i in rng.permutation(len(examples))]
        calibration = max(1, min(len(examples) - 1, int(calibration_share * len(examples) + 0.5)))
        splits.update({example: SPLITS[position >= calibration] for position, example in enumerate(shuffled)})
    return {example: splits[example] for example in levels}


def write_outcomes(
    outcomes: Sequence[ExampleOutcome],
    sizes: Sequence[str],
    out: str | Path,
    *,
    calibration_share: float = 0.5,
    seed: int = 0,
    overwrite: bool = False,
) -> OutcomesWritten:
    """Split the examples (`split_examples`) and write one JSON line per (split, example, size), calibration
    first, each example's sizes in `sizes` order; refused unless every example has exactly one outcome per size."""
    out = check_destination(out, overwrite)
    table: dict[str, dict[str, ExampleOutcome]] = {}
    for outcome in outcomes:
        if outcome.model in table.setdefault(outcome.id, {}):
            raise InputError(f"example {outcome.id!r} has two outcomes on size {outcome.model}")
        table[outcome.id][outcome.model] = outcome
    for example, by_size in table.items():
        absent = [size for size in sizes if size not in by_size]
        if absent:
            raise InputError(f"example {example!r} has no outcome on size(s) {absent}: the sizes saw different data")
    splits = split_examples({example: by_size[sizes[0]].level for example, by_size in table.items()},
                            calibration_share, seed)  # fmt: skip
    counts = {split: sum(1 for s in splits.values() if s == split) for split in SPLITS}
    if not counts["test"]:
        raise InputError(f"{len(table)} example(s) leave none for the test split; give more examples")
    with atomic_file(out) as handle:
        for split in SPLITS:
            for example in (e for e in table if splits[e] == split):
                for size in sizes:
                    handle.write(json.dumps(table[example][size].row(split), ensure_ascii=False) + "\n")

    def split_means(value: Callable[[ExampleOutcome], float]) -> dict[str, dict[str, float]]:
        members = {split: [e for e in table if splits[e] == split] for split in SPLITS}
        return {
            size: {split: float(np.mean([value(table[e][size]) for e in chosen])) for split, chosen in members.items()}
            for size in sizes
        }

    means = split_means(lambda outcome: outcome.correct)
    losses = None
    if all(outcome.nll is not None and outcome.scored_tokens for outcome in outcomes):
        losses = split_means(lambda outcome: outcome.nll / outcome.scored_tokens)
    has_levels = any(outcome.level is not None for outcome in outcomes)
    return OutcomesWritten(out, counts, has_levels, means, losses)
