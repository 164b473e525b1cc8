"""Per-token and per-sequence log-probabilities of the label tokens, without building (batch, seq, vocab) logits.

The numbers come from TRL's fused LM head (`trl.trainer.utils.add_fused_lm_head`), the same kernel the
SFT trainer optimises, so a score and a training loss on the same tokens agree exactly; it handles logit
scaling and Gemma's soft-capping. TRL 1.14 has no fused head (`kinfolk.compat.trl`): there the numbers come
from the model's logits, as that version's SFT trainer computes its loss. Labels follow TRL's convention: `-100` marks positions with no loss,
and `log_probs[:, t]` scores `labels[:, t + 1]`.

>>> import torch
>>> from kinfolk.testing import build_model
>>> model = build_model("llama", "small")
>>> ids = torch.tensor([[5, 6, 7, 8]])
>>> log_probs, mask = label_log_probs(model, ids, torch.ones_like(ids), ids)
>>> log_probs.shape, int(mask.sum())
(torch.Size([1, 3]), 3)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from kinfolk.compat.trl import FUSED_KERNELS, label_log_probs_from_logits
from kinfolk.layout import base_model
from kinfolk.tokens import IGNORE_INDEX


def has_fused_lm_head(model: nn.Module) -> bool:
    forward = getattr(base_model(model), "forward", None)
    return getattr(getattr(forward, "__code__", None), "co_name", "") == "_fused_forward"


def enable_fused_lm_head(model: nn.Module) -> nn.Module:
    """Patch `model` (or a PEFT model's base) with TRL's fused head once; generation is unaffected."""
    if not has_fused_lm_head(model):
        from trl.trainer.utils import add_fused_lm_head  # TRL >= 1.15 (FUSED_KERNELS)

        add_fused_lm_head(base_model(model), outputs=("log_probs",))
    return model


def pad_right(
    sequences: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """Right-pad token and label lists into `input_ids`, `attention_mask` and `labels` (-100 on padding)."""
    width = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    label_ids = torch.full((len(sequences), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, (sequence, label) in enumerate(zip(sequences, labels)):
        input_ids[row, : len(sequence)] = torch.as_tensor(sequence, dtype=torch.long)
        label_ids[row, : len(label)] = torch.as_tensor(label, dtype=torch.long)
        attention_mask[row, : len(sequence)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": label_ids}


def label_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    labels: torch.Tensor,
    **forward_kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each next label token: returns `(log_probs, mask)`, both (B, T-1), zero where masked.

    Differentiable (gradients flow as in training); wrap in `torch.inference_mode()` for scoring.
    `forward_kwargs` pass through to the model (e.g. `position_ids` for padding-free batches).
    """
    if not FUSED_KERNELS:
        outputs = model(input_ids=input_ids, attention_mask=attention_mask, **forward_kwargs)
        return label_log_probs_from_logits(outputs.logits, labels)
    enable_fused_lm_head(model)
    outputs = model(
        input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True, **forward_kwargs
    )
    return outputs.log_probs, outputs.label_mask


def sequence_log_probs(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of label log-probs per row and the number of label tokens per row (both shape (B,))."""
    log_probs, mask = label_log_probs(model, input_ids, attention_mask, labels)
    return log_probs.float().sum(dim=-1), mask.sum(dim=-1)
