"""Answer churn beside the KL: what a retained KL of 1e-4 means for the model's answers.

Each run of a comparison keeps the greedy answers of a fixed set of retained prompts (the first `--churn_prompts`
rows of the retained KL split: a row's prompt, its messages before the last answer, or the first
`PROMPT_TOKENS` tokens of a text row; `--churn_tokens` new tokens each) at every measurement, step 0 included,
in `answers.jsonl` beside its `drift.jsonl` (`AnswersCallback`). At a verdict level, a run's churn is the count of
prompts whose answer at the checkpoint nearest the level (of the two measurements around the point where the run
first reaches it, the one whose target is closer) differs from its answer at step 0: C of `kinfolk.drift.churn`'s
transitions (`churn_counts`), the same measurement the lab and `kinfolk churn` use. A method's churn at the level
is the mean of its seeds' counts, said with the steps it was read at.

>>> from kinfolk.drift import Run
>>> run = Run("lora", "0", "", [(0, 0.0, 0.0), (5, 1.0, 0.01), (10, 3.0, 0.05)])
>>> nearest_checkpoint(run, 2.5), nearest_checkpoint(run, 1.5), nearest_checkpoint(run, 4.0)
(10, 5, None)
>>> changed_answers({0: [[1, 2], [3]], 10: [[1, 2], [4]]}, 10)
1
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice, pairwise
from pathlib import Path

from kinfolk.callbacks.schedule import MeasuredAtSteps
from kinfolk.drift import Run
from kinfolk.drift.churn import Outcome, churn_counts

ANSWERS_FILE = "answers.jsonl"
PROMPT_TOKENS = 32  # a text row's prompt: its first tokens (a retained text has no question to answer)


def retained_prompts(rows: Sequence[Mapping], tokenizer, count: int) -> list[list[int]]:
    """Token ids of the first `count` retained rows' prompts (see the module)."""
    prompts = []
    for row in islice(rows, count):
        messages = row.get("messages") or (row.get("prompt") if isinstance(row.get("prompt"), list) else None)
        if messages is not None:
            if messages and messages[-1].get("role") == "assistant":  # the answer the model is to give
                messages = messages[:-1]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            prompts.append(list(ids["input_ids"] if isinstance(ids, Mapping) else ids))
        elif isinstance(row.get("prompt"), str):
            prompts.append(tokenizer(row["prompt"])["input_ids"])
        else:
            prompts.append(tokenizer(row["text"])["input_ids"][:PROMPT_TOKENS])
    return prompts


def greedy_answers(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, pad_id: int, batch_size: int = 16):
    """Each prompt's greedy continuation (new token ids, up to `max_new_tokens`), prompts left-padded per batch."""
    import torch

    answers = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        width = max(len(prompt) for prompt in batch)
        ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in batch], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=pad_id, use_cache=True)  # fmt: skip
        answers += [row[width:].tolist() for row in out]
    return answers


class AnswersCallback(MeasuredAtSteps):
    """At step 0, every `every_n_steps` or at `at_steps`, and at the end, append the prompts' greedy answers to
    `path`."""

    def __init__(self, trainer, prompts: list[list[int]], every_n_steps: int | None, max_new_tokens: int, path: Path,
                 at_steps: Collection[int] | None = None):  # fmt: skip
        super().__init__(every_n_steps=every_n_steps, measure_at_start=True, at_steps=at_steps)
        self.trainer, self.prompts, self.max_new_tokens, self.path = trainer, prompts, max_new_tokens, Path(path)

    def measure_step(self, args, state, control) -> None:
        model = self.trainer.model
        tokenizer = self.trainer.processing_class
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        training = model.training
        model.eval()
        try:
            answers = greedy_answers(model, self.prompts, self.max_new_tokens, pad)
        finally:
            model.train(training)
        with open(self.path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"step": state.global_step, "answers": answers}) + "\n")


def read_answers(folder: str | Path) -> dict[int, list[list[int]]]:
    """A run's answers per measured step ({} when the run kept none)."""
    path = Path(folder) / ANSWERS_FILE
    if not path.is_file():
        return {}
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {int(line["step"]): line["answers"] for line in lines}


def nearest_checkpoint(run: Run, level: float) -> int | None:
    """The step of the measurement nearest the point where `run` first reaches `level`: of the two records of its
    envelope around it, the one whose target is closer (the later on a tie); None when it never reaches it."""
    records = run.envelope()
    for (step_a, target_a, _), (step_b, target_b, _) in pairwise(records):
        if target_a <= level <= target_b:
            return step_a if level - target_a < target_b - level else step_b
    return records[0][0] if records and records[0][1] == level else None


def changed_answers(answers: Mapping[int, list[list[int]]], step: int) -> int:
    """How many prompts' answers at `step` differ from step 0's (`churn_counts`' C)."""
    before = {i: Outcome(tuple(answer), False) for i, answer in enumerate(answers[0])}
    after = {i: Outcome(tuple(answer), False) for i, answer in enumerate(answers[step])}
    return churn_counts(before, after)["C"]


@dataclass(frozen=True)
class LevelChurn:
    """One method's churn at one level: the mean count over seeds, of `prompts`, read at `steps` (one per seed)."""

    method: str
    level: float
    changed: float | None  # None: a seed kept no answers at that step, or never reached the level
    prompts: int
    steps: list[int | None]


def level_churn(method: str, runs: Sequence[Run], level: float) -> LevelChurn:
    """`method`'s churn at `level` over its seeds' runs (each run's answers read from its folder)."""
    counts, steps, prompts = [], [], 0
    for run in runs:
        answers, step = read_answers(run.path), nearest_checkpoint(run, level)
        steps.append(step)
        if step is not None and 0 in answers and step in answers:
            counts.append(changed_answers(answers, step))
            prompts = len(answers[0])
    changed = sum(counts) / len(counts) if counts and len(counts) == len(runs) else None
    return LevelChurn(method, level, changed, prompts, steps)
