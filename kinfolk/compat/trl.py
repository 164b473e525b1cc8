"""TRL inside kinfolk's tested window: its fused LM head and chunked divergence kernel arrived in 1.15.

From 1.15, `trl.trainer.utils.add_fused_lm_head` patches a model so that `model(..., labels=labels,
fused_lm_head=True)` returns each label token's log-probability without building (batch, seq, vocab) logits,
`SFTTrainer.compute_loss` reduces those log-probabilities, and `trl.kernels.chunked_divergence.
ChunkedDivergenceFunction` computes a divergence between two LM heads in tiles. TRL 1.14 has neither: its
`SFTTrainer.compute_loss` takes the model's own loss, computed from the full logits. On 1.14 kinfolk computes the
same numbers from the logits (`label_log_probs_from_logits`, `divergence_from_logits`): equal to float32
rounding, at the memory cost of one (tokens × vocabulary) float32 matrix per call.

>>> import torch
>>> logits = torch.log(torch.tensor([[[0.5, 0.5, 0.0], [0.25, 0.25, 0.5], [1.0, 1.0, 1.0]]]))
>>> log_probs, mask = label_log_probs_from_logits(logits, torch.tensor([[-100, 0, 2]]))
>>> log_probs.exp(), mask
(tensor([[0.5000, 0.5000]]), tensor([[True, True]]))
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from kinfolk.compat import at_least, warn_about_versions_outside_window
from kinfolk.tokens import IGNORE_INDEX

warn_about_versions_outside_window()

FUSED_KERNELS_SINCE = "1.15.0"
FUSED_KERNELS = at_least("trl", FUSED_KERNELS_SINCE)
SEEDS_BEFORE_PEFT = at_least("trl", "1.15.0")


def seed_adapter_init(seed: int) -> None:
    """From 1.15 `SFTTrainer` seeds the RNGs with `args.seed` before it wraps the model with PEFT, so an adapter's
    initial weights follow the seed; 1.14 wraps first (Trainer seeds afterwards), so they followed whatever the
    process had drawn before. On 1.14 this seeds the same way, before `SFTTrainer.__init__`."""
    if not SEEDS_BEFORE_PEFT:
        from transformers import set_seed

        set_seed(seed)


def label_log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What TRL's fused head returns, from (B, T, V) logits: the float32 log-prob of each next label token and the
    label mask, both (B, T-1); `log_probs[:, t]` scores `labels[:, t + 1]`, zero where the label is -100."""
    targets = labels[:, 1:]
    mask = targets != IGNORE_INDEX
    log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return picked * mask, mask


@torch.no_grad()
def chunked_nll_metrics(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The counts TRL 1.14's `loss_type="chunked_nll"` forward returns beside its loss and `SFTTrainer.compute_loss`
    logs (entropy, token accuracy), from (B, T, V) logits and the (B, T-1) label mask."""
    shifted = logits[:, :-1].float()
    log_probs = torch.log_softmax(shifted, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    correct = (shifted.argmax(-1) == labels[:, 1:]) & mask
    return {"num_valid_tokens": mask.sum(), "entropy_sum": (entropy * mask).sum(), "num_correct_tokens": correct.sum()}


def _scaled_log_probs(hidden, weight, bias, scale, softcap, temperature) -> torch.Tensor:
    """Log-softmax of a head's logits transformed as the model does: × scale, soft-capped, ÷ temperature."""
    logits = F.linear(hidden.float(), weight.float(), None if bias is None else bias.float()) * scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return torch.log_softmax(logits / temperature, dim=-1)


def _divergence(current_hidden, current_weight, current_bias, frozen_log_probs, beta, temperature, scale, softcap):
    log_current = _scaled_log_probs(current_hidden, current_weight, current_bias, scale, softcap, temperature)
    if beta == 0.0:  # forward KL(frozen || current)
        return (frozen_log_probs.exp() * (frozen_log_probs - log_current)).sum(-1)
    if beta == 1.0:  # reverse KL(current || frozen)
        return (log_current.exp() * (log_current - frozen_log_probs)).sum(-1)
    # generalised JSD around the mixture (1 - β)·current + β·frozen
    log_mixture = torch.logaddexp(log_current + math.log(1 - beta), frozen_log_probs + math.log(beta))
    frozen_part = (frozen_log_probs.exp() * (frozen_log_probs - log_mixture)).sum(-1)
    current_part = (log_current.exp() * (log_current - log_mixture)).sum(-1)
    return beta * frozen_part + (1 - beta) * current_part


def divergence_from_logits(
    current_hidden: torch.Tensor,
    current_weight: torch.Tensor,
    current_bias: torch.Tensor | None,
    frozen_hidden: torch.Tensor,
    frozen_weight: torch.Tensor,
    frozen_bias: torch.Tensor | None,
    beta: float,
    temperature: float = 1.0,
    current_scale: float = 1.0,
    current_softcap: float | None = None,
    frozen_scale: float = 1.0,
    frozen_softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ChunkedDivergenceFunction.apply`'s arguments and results on TRL 1.14: the per-token divergence (N,) (β 0:
    forward KL, 1: reverse KL, between: the generalised JSD) and the current side's entropy at `temperature`
    (N,, no gradient).

    The (N, V) logits are recomputed in the backward pass (activation checkpointing), so a call holds one such
    matrix at a time, as the kernel's caller expects of its token chunks."""
    with torch.no_grad():
        frozen = _scaled_log_probs(
            frozen_hidden, frozen_weight, frozen_bias, frozen_scale, frozen_softcap, temperature
        )
        current = _scaled_log_probs(
            current_hidden, current_weight, current_bias, current_scale, current_softcap, temperature
        )
        entropy = -(current.exp() * current).sum(-1)
    arguments = (current_hidden, current_weight, current_bias, frozen, beta, temperature, current_scale)
    if torch.is_grad_enabled() and current_hidden.requires_grad | current_weight.requires_grad:
        return checkpoint(_divergence, *arguments, current_softcap, use_reentrant=False), entropy
    return _divergence(*arguments, current_softcap), entropy


def chunked_divergence_function():
    """TRL's chunked divergence kernel (`ChunkedDivergenceFunction.apply`) from 1.15, else its stand-in. Under
    DeepSpeed ZeRO-3 the stand-in too: TRL's kernel then gathers both heads as DeepSpeed parameters and fails on a
    plain tensor (a frozen head's copy, any detached head), where kinfolk has gathered the heads already."""
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    if not FUSED_KERNELS or is_deepspeed_zero3_enabled():
        return divergence_from_logits
    from trl.kernels.chunked_divergence import ChunkedDivergenceFunction

    return ChunkedDivergenceFunction.apply
