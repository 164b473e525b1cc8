"""Skill scores by greedy decoding: the answer a model gives to each test problem, checked against the generator.

Three numbers per skill: `accuracy` (the correct answer in the preferred format: what p* asks for),
`answer_accuracy` (the correct answer in any format) and `preferred_format` (share of responses in the preferred
format, right or wrong).

>>> from kinfolk.lab.skills import SKILLS
>>> score_responses(SKILLS["add"], ["12+30=", "1+1="], ["42", "[2]"])
{'accuracy': 0.5, 'answer_accuracy': 1.0, 'preferred_format': 0.5}
"""

from __future__ import annotations

import torch

from kinfolk.lab.corpus import eval_problems
from kinfolk.lab.skills import SKILLS, Skill, answer_of, render

MAX_NEW_TOKENS = 10


@torch.inference_mode()
def generate_responses(model, tokenizer, prompts: list[str], batch_size: int = 256) -> list[str]:
    """Greedy responses (up to EOS or `MAX_NEW_TOKENS` characters) to `prompts`, decoded without special tokens."""
    was_training = model.training
    model.eval()
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    responses = []
    try:
        for start in range(0, len(prompts), batch_size):
            batch = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True)
            batch = batch.to(next(model.parameters()).device)
            output = model.generate(
                **batch,
                do_sample=False,
                max_new_tokens=MAX_NEW_TOKENS,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            new_tokens = output[:, batch["input_ids"].shape[1] :]
            responses.extend(tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
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
    model, tokenizer, skills: list[str] | None = None, n: int = 200, seed: int = 0, format_index: int = 0
) -> dict[str, dict]:
    """{skill: {accuracy, answer_accuracy, preferred_format}} on `n` test problems of each skill."""
    scores = {}
    for name in skills or list(SKILLS):
        prompts = eval_problems(name, n, seed)["prompt"]
        responses = generate_responses(model, tokenizer, prompts)
        scores[name] = score_responses(SKILLS[name], prompts, responses, format_index)
    return scores
