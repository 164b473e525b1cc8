"""Tiny datasets in the shapes TRL's SFTTrainer accepts: text, prompt/completion (plain and conversational)
and messages. Contents are small arithmetic and word tasks, seeded, so answers are checkable.

>>> from kinfolk.testing import prompt_completion_dataset
>>> prompt_completion_dataset(3).column_names
['prompt', 'completion']
"""

from __future__ import annotations

import random

from datasets import Dataset

_WORDS = ("stone", "river", "cloud", "apple", "tiger", "lemon", "piano", "chair", "bread", "ocean")


def _task(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return f"What is {a} + {b}?", f" {a + b}"
    word = rng.choice(_WORDS)
    return f"Reverse the word '{word}'.", f" {word[::-1]}"


def text_dataset(n: int = 16, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    return Dataset.from_list([{"text": "".join(_task(rng))} for _ in range(n)])


def prompt_completion_dataset(n: int = 16, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        prompt, completion = _task(rng)
        rows.append({"prompt": prompt, "completion": completion})
    return Dataset.from_list(rows)


def conversational_dataset(n: int = 16, seed: int = 0, system: bool = True) -> Dataset:
    """`messages` rows: an optional system turn, a user question and the assistant's answer."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        prompt, completion = _task(rng)
        messages = [{"role": "system", "content": "You are a helpful assistant."}] if system else []
        messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion.strip()}]
        rows.append({"messages": messages})
    return Dataset.from_list(rows)


def conversational_prompt_completion_dataset(n: int = 16, seed: int = 0) -> Dataset:
    """Prompt/completion where both sides are message lists (TRL's conversational prompt-completion type)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        prompt, completion = _task(rng)
        rows.append(
            {
                "prompt": [{"role": "user", "content": prompt}],
                "completion": [{"role": "assistant", "content": completion.strip()}],
            }
        )
    return Dataset.from_list(rows)
