"""How close a patched size is to its variant: KL per response token and cosines per layer and position."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from kinfolk.lab.world.tokenizer import MAX_LENGTH


# ------------------------------------------------------------------------------------------------ measurement
@torch.no_grad()
def teacher_agreement(model, teacher, batches: list[dict[str, torch.Tensor]], aligned: list[int]) -> dict[str, Any]:
    """KL(teacher ‖ model) per response token (positions whose next label is trained), and the cosine of the
    model's hidden states to the teacher's: per model layer against teacher layer `aligned[j]` (the last of its
    block) over every real position, and of the final layer (after the final norm) per position index, with its
    means over prompt and response positions."""
    from kinfolk.trainers.layer_distillation_trainer import LayerOutputs

    model_outputs = LayerOutputs(model, list(range(len(aligned))))
    teacher_outputs = LayerOutputs(teacher, sorted(set(aligned)))
    try:
        return _agreement(model, teacher, batches, aligned, model_outputs, teacher_outputs)
    finally:
        model_outputs.remove()
        teacher_outputs.remove()


def _agreement(model, teacher, batches, aligned, model_outputs, teacher_outputs) -> dict[str, Any]:
    kl_sum, kl_count = 0.0, 0
    layer_sums = np.zeros(len(aligned))
    position_sums, position_counts = np.zeros(MAX_LENGTH), np.zeros(MAX_LENGTH)
    part_sums, part_counts = {"prompt": 0.0, "response": 0.0}, {"prompt": 0, "response": 0}
    real_count = 0
    for batch in batches:
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        with model_outputs.record() as ours:
            logits = model(**inputs).logits.float()
        with teacher_outputs.record() as theirs:
            teacher_logits = teacher(**inputs).logits.float()
        real = batch["attention_mask"].bool()
        real_count += int(real.sum())
        for j, layer in enumerate(aligned):
            layer_sums[j] += float(
                F.cosine_similarity(ours[j][real].float(), theirs[layer][real].float(), dim=-1).sum()
            )
        final = F.cosine_similarity(ours["final"].float(), theirs["final"].float(), dim=-1)  # (batch, length)
        width = final.shape[1]
        position_sums[:width] += (final * real).sum(0).numpy()
        position_counts[:width] += real.sum(0).numpy()
        response = torch.zeros_like(real)
        response[:, 1:] = batch["labels"][:, 1:] != -100  # the tokens the variant was trained to answer
        for part, mask in (("response", response & real), ("prompt", ~response & real)):
            part_sums[part] += float(final[mask].sum())
            part_counts[part] += int(mask.sum())
        scored = batch["labels"][:, 1:] != -100  # position t predicts label t + 1
        teacher_log = teacher_logits[:, :-1][scored].log_softmax(-1)
        kl_sum += float((teacher_log.exp() * (teacher_log - logits[:, :-1][scored].log_softmax(-1))).sum())
        kl_count += int(scored.sum())
    used = position_counts > 0
    return {
        "kl": kl_sum / kl_count,
        "cosine_per_layer": (layer_sums / real_count).tolist(),
        "cosine_per_position": (position_sums[used] / position_counts[used]).tolist(),
        "cosine_final": {part: part_sums[part] / max(part_counts[part], 1) for part in part_sums},
    }
