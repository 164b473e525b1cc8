"""Difficulty of a prompt from one forward pass of a chosen model (ADAPT App. I.1): the prompt is put into a rating
template and the level whose label the model finds most likely as the next token is its difficulty. No generation.

    rater = AutoModelForCausalLM.from_pretrained("models/Qwen3-4B-Instruct")
    levels = rate_difficulty(rater, tokenizer, questions,
                             template="Rate the difficulty of this problem from 1 to 5.\\n{prompt}\\nRating: ",
                             labels=["1", "2", "3", "4", "5"])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kinfolk.errors import InputError

PROMPT_FIELD = "{prompt}"


def label_tokens(tokenizer, labels: Sequence[str]) -> list[int]:
    """The first token of each label (as it follows the template); they must differ, or one pass cannot tell them
    apart."""
    tokens = []
    for label in labels:
        ids = tokenizer(label, add_special_tokens=False)["input_ids"]
        if not ids:
            raise InputError(f"difficulty label {label!r} is empty once tokenised")
        tokens.append(ids[0])
    if len(set(tokens)) != len(tokens):
        raise InputError(f"difficulty labels {list(labels)} do not start with distinct tokens")
    return tokens


@torch.inference_mode()
def rate_difficulty(
    model, tokenizer, prompts: Sequence[str], template: str, labels: Sequence[str], batch_size: int = 16
) -> list[str]:
    """For each prompt, the label of `labels` whose first token has the highest next-token logit after
    `template` with the prompt in place of `{prompt}`."""
    if PROMPT_FIELD not in template:
        raise InputError(f"the rating template must contain {PROMPT_FIELD}, got {template!r}")
    tokens = torch.as_tensor(label_tokens(tokenizer, labels))
    was_training = model.training
    model.eval()
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"  # the last position is the next token's
    device = next(model.parameters()).device
    rated = []
    try:
        for start in range(0, len(prompts), batch_size):
            texts = [template.replace(PROMPT_FIELD, prompt) for prompt in prompts[start : start + batch_size]]
            batch = tokenizer(texts, return_tensors="pt", padding=True).to(device)
            # positions count real tokens only, so a left-padded prompt reads as it would alone
            positions = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            logits = model(**batch, position_ids=positions, logits_to_keep=1).logits[:, -1]
            rated += [labels[i] for i in logits[:, tokens.to(device)].argmax(dim=-1).tolist()]
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    return rated
