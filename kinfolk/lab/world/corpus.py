"""The lab's datasets, all prompt/completion rows drawn deterministically from a seed.

- `pretraining_dataset`: lines of Python's own standard-library sources (real text present on every machine; an
  empty prompt, the whole line is the completion) mixed with every skill's problems, answers in a uniformly random
  format (a base model has seen every style);
- `ideal_dataset`: p*, correct answers in one format (the preferred one for the instruct model, another for a
  second response style);
- `pool_dataset`: the SFT pool drawn from p_d, with each row's kind, log p_d, log p* and true ratio p*/p_d;
- `eval_problems`: problems of the test split, with their answers.

>>> rows = pool_dataset(["add"], 4, seed=0)
>>> rows.column_names
['prompt', 'completion', 'skill', 'kind', 'pool_logprob', 'ideal_logprob', 'true_ratio']
>>> sorted(set(rows["true_ratio"])) <= [0.0, 2.5]
True
"""

from __future__ import annotations

import math
import random
import sysconfig
from functools import cache
from pathlib import Path

from datasets import Dataset

from kinfolk.lab.world.skills import (
    ALL_SKILLS,
    FORMATS,
    POOL_MIX,
    ideal_log_probability,
    pool_log_probability,
    render,
    sample_pool_response,
)

# Small, stable modules of the standard library; their lines are the corpus's natural text.
STDLIB_SOURCES = ("string.py", "textwrap.py", "heapq.py", "bisect.py", "fnmatch.py", "colorsys.py", "shlex.py")
MAX_TEXT_CHARS = 48


@cache
def stdlib_lines() -> tuple[str, ...]:
    """Non-blank, ASCII, stripped lines of `STDLIB_SOURCES`, at most `MAX_TEXT_CHARS` long."""
    root = Path(sysconfig.get_paths()["stdlib"])
    lines = []
    for name in STDLIB_SOURCES:
        for line in (root / name).read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if 4 <= len(line) <= MAX_TEXT_CHARS and line.isascii():
                lines.append(line)
    return tuple(lines)


def pretraining_dataset(
    n: int, seed: int, skill_shares: dict[str, float], text_share: float = 0.3, split: str = "train"
) -> Dataset:
    """`n` rows: a `text_share` of standard-library lines, the rest problems of each skill in `skill_shares`.

    A problem is a (prompt, answer) row, so the trainer's `prompt_loss_weight` down-weights its prompt (which made
    the skills learnable several times faster); a text line is all completion (an empty prompt).
    """
    rng = random.Random(f"pretraining-{seed}")
    text = stdlib_lines()
    names, shares = zip(*skill_shares.items())
    rows = []
    for _ in range(n):
        if rng.random() < text_share:
            rows.append({"prompt": "", "completion": rng.choice(text)})
            continue
        skill = ALL_SKILLS[rng.choices(names, weights=shares)[0]]
        prompt, answer = skill.sample(rng, split)
        rows.append({"prompt": prompt, "completion": render(answer, rng.randrange(len(FORMATS)))})
    return Dataset.from_list(rows)


def ideal_dataset(skills: list[str], n: int, seed: int, format_index: int = 0, split: str = "train") -> Dataset:
    """`n` correct answers to problems of `skills` (round robin), all in `FORMATS[format_index]`."""
    rng = random.Random(f"ideal-{format_index}-{seed}")
    rows = []
    for i in range(n):
        skill = ALL_SKILLS[skills[i % len(skills)]]
        prompt, answer = skill.sample(rng, split)
        rows.append({"prompt": prompt, "completion": render(answer, format_index), "skill": skill.name})
    return Dataset.from_list(rows)


def pool_dataset(skills: list[str], n: int, seed: int, mix: dict[str, float] = POOL_MIX) -> Dataset:
    """The SFT pool: `n` responses drawn from p_d (response kinds in `mix`), with their ground truth (log p_d,
    log p*, p*/p_d)."""
    rng = random.Random(f"pool-{seed}" if mix == POOL_MIX else f"pool-{seed}-{sorted(mix.items())}")
    rows = []
    for i in range(n):
        skill = ALL_SKILLS[skills[i % len(skills)]]
        prompt, _ = skill.sample(rng, "train")
        response, kind = sample_pool_response(skill, prompt, rng, mix)
        pool = pool_log_probability(skill, prompt, response, mix)
        ideal = ideal_log_probability(skill, prompt, response)
        rows.append(
            {
                "prompt": prompt,
                "completion": response,
                "skill": skill.name,
                "kind": kind,
                "pool_logprob": pool,
                "ideal_logprob": ideal,
                "true_ratio": math.exp(ideal - pool),
            }
        )
    return Dataset.from_list(rows)


def eval_problems(skill: str, n: int, seed: int = 0, split: str = "test") -> Dataset:
    """`n` problems of `split` ("test", or "validation" for choosing settings; never seen in training) with their
    correct answers; a family's seed draws its own test problems."""
    rng = random.Random(f"eval-{skill}-{seed}" if split == "test" else f"{split}-{skill}-{seed}")
    rows = [dict(zip(("prompt", "answer"), ALL_SKILLS[skill].sample(rng, split))) for _ in range(n)]
    return Dataset.from_list(rows)
