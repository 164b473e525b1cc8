"""The lab's skills: problems with verifiable answers, answer formats, and the two response distributions.

Three skills (and `flip`, below), each a prompt ending in "=" and a short answer:

| skill | role | prompt | answer |
|---|---|---|---|
| `copy` | retained (the base learns it in pre-training; post-training must keep it) | `copy bdfh=` | `bdfh` |
| `reverse` | target (stands in for coding: half as frequent as copying in pre-training; learned by SFT / adapters) | `rev kmqa=` | `aqmk` |
| `add` | held out (2-digit addition; in pre-training only, never post-trained on) | `37+45=` | `82` |
| `flip` | separated target of the ATLAS experiment (its families' pre-training only) | `flip 4821=` | `1284` |

`SKILLS` are every family's: scored at each build and covered by the lab's lm-eval tasks. `EXTRA_SKILLS` are used
only by the experiments that ask for them (through `LabConfig.skill_shares` and `post_trained_skills`); they draw
with their own generators, so the data of the core skills and the default pre-training mix do not change:

| skill | used by | prompt | answer | difficulty level |
|---|---|---|---|---|
| `reverse_graded` | ADAPT's size routing | `rev kmq=` (2 to 6 letters) | `qmk` | the word's length |

Two-digit addition was the first choice for the retained skill, but the lab's models do not learn it within the
lab's budgets (answer accuracy stayed at 2-10% after 600-1000 pre-training steps of the 4 × 128 model, with 2-digit
or 1-digit second operands), while copying is learned reliably by then; so copying is the retained skill and
addition stays as a held-out skill whose drift can still be measured (retained KL needs no competence).

An answer is written in one of `FORMATS`; the first is the preferred one. Ground truth for ATLANTIS:

- the ideal distribution p*(y|x) puts all its mass on the correct answer in the preferred format;
- the SFT pool's distribution p_d(y|x) is a mixture of response kinds (`POOL_MIX` by default): the ideal
  response, the correct answer in an off-format (uniform over the other formats), or a wrong answer (uniform over
  the skill's near-misses, preferred format). So every pool example's true ratio p*(y|x) / p_d(y|x) is known
  (`pool_log_probability`); other mixes (`NOISE_MIXES`: wrong answers only, off-format only) give other pools.

Every prompt belongs to one split (train, validation, test) by a hash of its text, so problems used to choose a
setting or to measure never appear in training data, and validation and test share no problem.

>>> import random
>>> prompt, answer = SKILLS["add"].sample(random.Random(0), "train")
>>> prompt, answer
('59+63=', '122')
>>> round(math.exp(pool_log_probability(SKILLS["add"], prompt, answer)), 4)  # good: p_d = 0.4
0.4
>>> round(math.exp(pool_log_probability(SKILLS["add"], prompt, "[122]")), 4)  # off-format: 0.3 / 2
0.15
>>> round(math.exp(pool_log_probability(SKILLS["add"], prompt, "123")), 4)  # wrong: 0.3 / 20
0.015
"""

from __future__ import annotations

import math
import random
import string
import zlib
from collections.abc import Callable
from dataclasses import dataclass

FORMATS = ("{}", " {}", "[{}]")  # FORMATS[0] is preferred
RESPONSE_KINDS = ("good", "off_format", "wrong")
POOL_MIX = {"good": 0.4, "off_format": 0.3, "wrong": 0.3}
# The noise factor of the ATLANTIS experiment: the same share of ideal responses, the rest one kind of noise or both.
NOISE_MIXES = {
    "both": POOL_MIX,
    "wrong": {"good": 0.4, "off_format": 0.0, "wrong": 0.6},
    "off_format": {"good": 0.4, "off_format": 0.6, "wrong": 0.0},
}
SPLITS = ("train", "validation", "test")
HELD_OUT_SHARE = 8  # by a CRC of its text, one prompt in 8 is a test problem and one in 8 a validation problem


def render(answer: str, format_index: int = 0) -> str:
    return FORMATS[format_index].format(answer)


def split_of(prompt: str) -> str:
    bucket = zlib.crc32(prompt.encode()) % HELD_OUT_SHARE
    return {0: "test", 1: "validation"}.get(bucket, "train")


def _letters(rng: random.Random, n: int) -> str:
    return "".join(rng.sample(string.ascii_lowercase, n))  # distinct letters: every swap changes the word


def _adjacent_swaps(word: str) -> list[str]:
    return [word[:i] + word[i + 1] + word[i] + word[i + 2 :] for i in range(len(word) - 1)]


@dataclass(frozen=True)
class Skill:
    """A problem generator: `draw(rng) -> (prompt, answer)`, `wrong(answer)` its distinct near-misses, and for a
    graded skill `level(prompt)`, the problem's difficulty."""

    name: str
    role: str
    draw: Callable[[random.Random], tuple[str, str]]
    solve: Callable[[str], str]
    wrong: Callable[[str], list[str]]
    level: Callable[[str], int] | None = None

    def sample(self, rng: random.Random, split: str) -> tuple[str, str]:
        """A (prompt, correct answer) pair whose prompt belongs to `split`."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        while True:
            prompt, answer = self.draw(rng)
            if split_of(prompt) == split:
                return prompt, answer


def _draw_add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"{a}+{b}=", str(a + b)


def _solve_add(prompt: str) -> str:
    a, b = prompt.rstrip("=").split("+")
    return str(int(a) + int(b))


def _wrong_add(answer: str) -> list[str]:
    return [str(int(answer) + delta) for delta in range(-10, 11) if delta]  # a + b >= 20, so all stay positive


def _draw_reverse(rng: random.Random) -> tuple[str, str]:
    word = _letters(rng, 4)
    return f"rev {word}=", word[::-1]


def _draw_copy(rng: random.Random) -> tuple[str, str]:
    word = _letters(rng, 4)
    return f"copy {word}=", word


def _word(prompt: str) -> str:
    return prompt.split(" ", 1)[1].rstrip("=")


SKILLS: dict[str, Skill] = {
    "copy": Skill("copy", "retained", _draw_copy, _word, _adjacent_swaps),
    "reverse": Skill("reverse", "target", _draw_reverse, lambda p: _word(p)[::-1], _adjacent_swaps),
    "add": Skill("add", "held_out", _draw_add, _solve_add, _wrong_add),
}
RETAINED, TARGET, HELD_OUT = "copy", "reverse", "add"


# A target whose inputs are far from the retained skill's (digits and its own prompt word, where copying has
# letters): reversal of 4 distinct digits. Not in the default pre-training mix; the ATLAS experiment's families
# add it through `LabConfig.skill_shares`.
def _draw_flip(rng: random.Random) -> tuple[str, str]:
    digits = "".join(rng.sample(string.digits, 4))
    return f"flip {digits}=", digits[::-1]


SKILLS["flip"] = Skill("flip", "separated target", _draw_flip, lambda p: _word(p)[::-1], _adjacent_swaps)
SEPARATED_TARGET = "flip"

GRADED = "reverse_graded"
GRADED_LENGTHS = (2, 6)  # shortest and longest word: the difficulty levels


def _draw_reverse_graded(rng: random.Random) -> tuple[str, str]:
    word = _letters(rng, rng.randint(*GRADED_LENGTHS))
    return f"rev {word}=", word[::-1]


EXTRA_SKILLS: dict[str, Skill] = {
    GRADED: Skill(
        GRADED, "graded", _draw_reverse_graded, lambda p: _word(p)[::-1], _adjacent_swaps, lambda p: len(_word(p))
    ),
}
ALL_SKILLS: dict[str, Skill] = SKILLS | EXTRA_SKILLS


def ideal_log_probability(skill: Skill, prompt: str, response: str) -> float:
    """log p*(y|x): 0 for the correct answer in the preferred format, -inf for anything else."""
    return 0.0 if response == render(skill.solve(prompt)) else -math.inf


def pool_log_probability(skill: Skill, prompt: str, response: str, mix: dict[str, float] = POOL_MIX) -> float:
    """log p_d(y|x) of a pool drawn with `mix` (see the module docstring), computed from the prompt alone."""
    answer = skill.solve(prompt)
    probability = 0.0
    if response == render(answer):
        probability += mix["good"]
    if response in {render(answer, k) for k in range(1, len(FORMATS))}:
        probability += mix["off_format"] / (len(FORMATS) - 1)
    wrong = skill.wrong(answer)
    if response in {render(w) for w in wrong}:
        probability += mix["wrong"] / len(wrong)
    return math.log(probability) if probability > 0 else -math.inf


def sample_pool_response(
    skill: Skill, prompt: str, rng: random.Random, mix: dict[str, float] = POOL_MIX
) -> tuple[str, str]:
    """A response drawn from p_d(.|prompt) with `mix`, and its kind ("good", "off_format" or "wrong")."""
    answer = skill.solve(prompt)
    kind = rng.choices(list(mix), weights=list(mix.values()))[0]
    if kind == "good":
        return render(answer), kind
    if kind == "off_format":
        return render(answer, rng.randint(1, len(FORMATS) - 1)), kind
    return render(rng.choice(skill.wrong(answer))), kind


def answer_of(response: str) -> str:
    """The answer inside a response of any format (brackets and surrounding spaces removed)."""
    return response.strip().removeprefix("[").removesuffix("]").strip()


def response_kind(skill: Skill, prompt: str, response: str) -> str:
    """ "good" (p*'s response), "off_format" (the correct answer in another format) or "wrong" (anything else)."""
    answer = skill.solve(prompt)
    if response == render(answer):
        return "good"
    return "off_format" if answer_of(response) == answer else "wrong"
