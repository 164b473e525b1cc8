"""Skill scores by greedy decoding: the answer a model gives to each test problem, checked against the generator.

Three numbers per skill: `accuracy` (the correct answer in the preferred format: what p* asks for),
`answer_accuracy` (the correct answer in any format) and `preferred_format` (share of responses in the preferred
format, right or wrong). `StopWhenLearned` stops a training run once a skill's score reaches a level.

A score is a function of the model's weights alone: decoding runs on one thread (the thread count changes float
reductions, and a greedy answer can hang on a near tie) and refuses a model whose forward still carries a
mixed-precision wrapper from training (accelerate's autocast would score other numbers than the saved weights give).

>>> from kinfolk.lab.world.skills import SKILLS
>>> score_responses(SKILLS["add"], ["12+30=", "1+1="], ["42", "[2]"])
{'accuracy': 0.5, 'answer_accuracy': 1.0, 'preferred_format': 0.5}
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import TrainerCallback

from kinfolk.lab.world.corpus import eval_problems
from kinfolk.lab.world.skills import ALL_SKILLS, SKILLS, Skill, answer_of, render
from kinfolk.lab.world.training import single_threaded

MAX_NEW_TOKENS = 10


@torch.inference_mode()
def _new_tokens(model, tokenizer, prompts: list[str], batch_size: int, **generate_options) -> list[torch.Tensor]:
    """The tokens `model.generate` adds after each prompt (left-padded batches; train mode and padding restored)."""
    if getattr(model, "_original_forward", None) is not None:
        raise ValueError(
            "the model's forward is wrapped for mixed precision (accelerate's autocast, left by a Trainer with "
            "bf16/fp16): its scores would not be those of its weights; train with bf16=False or score the saved model"
        )
    was_training = model.training
    model.eval()
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    rows = []
    try:
        with single_threaded():
            for start in range(0, len(prompts), batch_size):
                batch = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True)
                batch = batch.to(next(model.parameters()).device)
                output = model.generate(
                    **batch,
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id,
                    **generate_options,
                )
                rows.extend(output[:, batch["input_ids"].shape[1] :])
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    return rows


def generate_responses(model, tokenizer, prompts: list[str], batch_size: int = 256) -> list[str]:
    """Greedy responses (up to EOS or `MAX_NEW_TOKENS` characters) to `prompts`, decoded without special tokens."""
    new_tokens = _new_tokens(model, tokenizer, prompts, batch_size, do_sample=False, max_new_tokens=MAX_NEW_TOKENS)
    return tokenizer.batch_decode(new_tokens, skip_special_tokens=True)


def sample_responses(
    model, tokenizer, prompts: list[str], seed: int, batch_size: int = 256, max_new_tokens: int = 16
) -> list[str | None]:
    """Responses drawn from the model's own distribution (temperature 1, no top-k / top-p truncation), so their
    probability is exactly the model's sequence probability including EOS; None where no EOS came within
    `max_new_tokens` or a special token came before it (the text would not be the sequence drawn)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        new_tokens = _new_tokens(
            model,
            tokenizer,
            prompts,
            batch_size,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
        )
    responses: list[str | None] = []
    special = set(tokenizer.all_special_ids)
    for row in new_tokens:
        ends = (row == tokenizer.eos_token_id).nonzero()
        text = row[: int(ends[0])].tolist() if len(ends) else None
        # a special token before EOS would vanish in decoding, so the text would not be the sequence drawn
        responses.append(None if text is None or special & set(text) else tokenizer.decode(text))
    return responses


def score_responses(skill: Skill, prompts: list[str], responses: list[str], format_index: int = 0) -> dict[str, float]:
    """Accuracy and format share, with `FORMATS[format_index]` as the asked-for format (0: the preferred one)."""
    answers = [skill.solve(prompt) for prompt in prompts]
    n = len(prompts)
    return {
        "accuracy": sum(r == render(a, format_index) for r, a in zip(responses, answers)) / n,
        "answer_accuracy": sum(answer_of(r) == a for r, a in zip(responses, answers)) / n,
        "preferred_format": sum(r == render(answer_of(r), format_index) for r in responses) / n,
    }


def skill_scores(
    model,
    tokenizer,
    skills: list[str] | None = None,
    n: int = 200,
    seed: int = 0,
    format_index: int = 0,
    split: str = "test",
) -> dict[str, dict]:
    """{skill: {accuracy, answer_accuracy, preferred_format}} on `n` problems of `split` for each skill (default: the
    family's core `SKILLS`)."""
    scores = {}
    for name in skills or list(SKILLS):
        prompts = eval_problems(name, n, seed, split)["prompt"]
        responses = generate_responses(model, tokenizer, prompts)
        scores[name] = score_responses(ALL_SKILLS[name], prompts, responses, format_index)
    return scores


class StopWhenLearned(TrainerCallback):
    """Stop training once a skill is learned: every `every` steps, score `skill` on validation problems (greedy) and
    stop when `metric` reaches `at_least`. `learned_at` keeps the step (None if it never did).

    A lab skill is learned through a phase transition whose step varies from seed to seed; a fixed step budget makes
    whether a family has the skill a matter of luck, this rule makes it part of the design (within `max_steps`)."""

    def __init__(
        self,
        tokenizer,
        skill: str,
        metric: str,
        at_least: float,
        every: int,
        seed: int,
        problems: int = 200,
        report: Callable[[str], None] | None = None,
    ):
        self.tokenizer, self.skill, self.metric, self.at_least = tokenizer, skill, metric, at_least
        self.every, self.seed, self.problems, self.report = every, seed, problems, report
        self.learned_at: int | None = None
        self.history: list[tuple[int, float]] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every:
            return control
        scores = skill_scores(model, self.tokenizer, [self.skill], self.problems, self.seed, split="validation")
        value = scores[self.skill][self.metric]
        self.history.append((state.global_step, value))
        if self.report:
            self.report(f"step {state.global_step}: {self.skill} {self.metric} {value:.2f} (stop at {self.at_least})")
        if value >= self.at_least:
            self.learned_at = state.global_step
            control.should_training_stop = True
        return control
