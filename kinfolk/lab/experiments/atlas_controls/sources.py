"""The rows drift is measured on, and the measurement of one checkpoint.

Version 1 measured retained KL only on copy answers in the preferred format: the very template the atlas is fitted
on, while the reverse target is mostly a format switch (the frozen base already reverses in content). So lower
drift there could be the new format leaking less onto the atlas's own template, and nothing more. Here KL(frozen ‖
current) per response token is measured per split on four sources, each reported on its own:

| source | rows | the atlas's fitting data? |
|---|---|---|
| `copy` | copy problems, answers in the preferred format (version 1's measure) | its template (other problems) |
| `copy-formats` | copy problems, answers in the other two formats | no |
| `add` | 2-digit additions with their answers (a skill never post-trained on) | no |
| `text` | lines of the standard-library pre-training text, split by a hash of the line | no |

Validation and test rows share no problem or line (the lab's hash split); none is a train-split row (the atlas,
Replay and Output-KL use train-split copy rows).

>>> rows = source_rows("copy-formats", 4, seed=0, split="test")
>>> [c[0] in " [" for c in rows["completion"]]
[True, True, True, True]
>>> all(split_of(line) == "validation" for line in source_rows("text", 8, seed=0, split="validation")["completion"])
True
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset

from kinfolk.lab.experiments.atlas_controls.settings import SOURCES
from kinfolk.lab.world import corpus
from kinfolk.lab.world.skills import HELD_OUT, RETAINED, render, split_of
from kinfolk.lab.world.tokenizer import MAX_LENGTH


def source_rows(source: str, n: int, seed: int, split: str) -> Dataset:
    """`n` (prompt, completion) rows of one drift source from `split`."""
    if source == "text":
        lines = sorted({line for line in corpus.stdlib_lines() if split_of(line) == split})
        chosen = random.Random(f"text-{seed}-{split}").sample(lines, min(n, len(lines)))
        return Dataset.from_dict({"prompt": [""] * len(chosen), "completion": chosen})
    skill = HELD_OUT if source == "add" else RETAINED
    problems = corpus.eval_problems(skill, n, seed, split)
    formats = [1 + i % 2 for i in range(n)] if source == "copy-formats" else [0] * n
    completions = [render(answer, f) for answer, f in zip(problems["answer"], formats)]
    return Dataset.from_dict({"prompt": problems["prompt"], "completion": completions})


@dataclass
class DriftSources:
    """Each split's and source's batches with the frozen model's log-probs on them (computed once per family)."""

    batches: dict[str, dict[str, tuple[list[dict], Any]]]  # split -> source -> (batches, frozen cache)

    @classmethod
    def build(cls, frozen: torch.nn.Module, tokenizer, n: int, seed: int, splits: tuple[str, ...]) -> DriftSources:
        from kinfolk.batches import retained_batches
        from kinfolk.divergence import FrozenCache

        batches: dict[str, dict[str, tuple[list[dict], Any]]] = {}
        for split in splits:
            batches[split] = {}
            for source in SOURCES:
                rows = retained_batches(source_rows(source, n, seed, split), tokenizer, "response", MAX_LENGTH, 64)
                batches[split][source] = (rows, FrozenCache.build(frozen, rows))
        return cls(batches)

    @torch.no_grad()
    def kl(self, model: torch.nn.Module, split: str) -> dict[str, float]:
        """KL(frozen ‖ model) per response token, per source (float64 sums)."""
        from kinfolk.divergence import token_divergence

        values = {}
        for source, (batches, frozen) in self.batches[split].items():
            total, tokens = 0.0, 0
            for batch in batches:
                result = token_divergence(
                    model, batch["input_ids"], batch["attention_mask"], batch["labels"], frozen=frozen
                )
                total += float(result.values[result.mask].double().sum())
                tokens += int(result.mask.sum())
            values[source] = total / max(tokens, 1)
        return values


def measure_checkpoint(
    context, sources: DriftSources, target: str, model: torch.nn.Module, step: int
) -> Mapping[str, Any]:
    """One checkpoint: per split, the target score (correct answer, preferred format) and each source's KL."""
    from kinfolk.lab.methods.atlas.runs import accuracy
    from kinfolk.lab.world.evaluate import generate_responses

    was_training = model.training
    model.eval()
    point: dict[str, Any] = {"step": step}
    for split in sources.batches:
        problems = context.problems[split][target]
        responses = generate_responses(model, context.tokenizer, problems["prompt"])
        point[split] = {"target": accuracy(problems, responses), "kl": sources.kl(model, split)}
    model.train(was_training)
    return point
