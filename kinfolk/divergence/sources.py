"""Where the frozen distribution comes from, and `token_divergence`, which compares it with the current model.

A `FrozenSource` gets a `Comparison` (the current model's hidden states at a batch's scored positions, the batch,
and which divergence at which temperature) and returns the per-token divergences. The live sources here run the
frozen model at every call; `caches` holds the ones computed once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from kinfolk.divergence.kernels import OutputHead, chunked_divergence, last_hidden_states
from kinfolk.tokens import IGNORE_INDEX


@dataclass
class TokenDivergence:
    """Per-position divergences (B, T−1), the positions that count, for a top-k cache an upper bound, and the
    current model's last hidden states at the counted positions (N, H), from which a measurement may also read the
    labels' likelihood without a second forward."""

    values: torch.Tensor
    mask: torch.Tensor
    upper_bound: torch.Tensor | None = None
    current_hidden: torch.Tensor | None = None

    def total(self) -> torch.Tensor:
        return self.values.sum()

    def count(self) -> torch.Tensor:
        return self.mask.sum()

    def mean(self) -> torch.Tensor:
        """Mean over the positions that count (zero when none do); keeps the graph for a regulariser."""
        return self.total() / self.count().clamp(min=1)


@dataclass(frozen=True)
class Comparison:
    """What a frozen source compares with: the current side of one batch and the divergence asked for.

    `current_hidden` (N, H) are the current model's last hidden states at the positions `mask` (B, T−1) marks, on
    the head's device; `input_ids`, `attention_mask` and `forward_kwargs` are the batch, for sources that run or look
    up the frozen model on it.
    """

    model: nn.Module
    current_hidden: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    mask: torch.Tensor
    kind: str = "forward_kl"
    beta: float = 0.5
    temperature: float = 1.0
    forward_kwargs: dict = field(default_factory=dict)


class FrozenSource:
    """Where the frozen distribution comes from."""

    def divergence(self, request: Comparison) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(N,) divergences at the request's scored positions and an optional (N,) upper bound."""
        raise NotImplementedError


def scored_positions(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, H) hidden states of the positions that predict a scored label, from (B, T, H) and a (B, T−1) mask."""
    return hidden[:, :-1][mask]


class DisabledAdapter(FrozenSource):
    """The frozen model is the PEFT model itself with its adapters switched off: no second copy in memory."""

    def divergence(self, request: Comparison):
        model = request.model
        if not hasattr(model, "disable_adapter"):
            raise TypeError(
                f"DisabledAdapter needs a peft.PeftModel (with `disable_adapter()`), got {type(model).__name__}; "
                "for full fine-tuning use ReferenceModel or FrozenCache"
            )
        with torch.no_grad(), model.disable_adapter():
            hidden = last_hidden_states(model, request.input_ids, request.attention_mask, **request.forward_kwargs)
            frozen_hidden = scored_positions(hidden, request.mask)
        head = OutputHead.of(model)  # never adapted (OutputHead refuses that), so both sides share it
        return chunked_divergence(
            request.current_hidden, head, frozen_hidden, head, request.kind, request.beta, request.temperature
        ), None


class ReferenceModel(FrozenSource):
    """A separate frozen model (same vocabulary) supplies the frozen distribution; it never gets gradients."""

    def __init__(self, model: nn.Module):
        self.model = model

    def divergence(self, request: Comparison):
        with torch.no_grad():
            hidden = last_hidden_states(
                self.model, request.input_ids, request.attention_mask, **request.forward_kwargs
            )
            frozen_hidden = scored_positions(hidden, request.mask)
        frozen_hidden = frozen_hidden.to(request.current_hidden.device)
        current_head, frozen_head = OutputHead.of(request.model), OutputHead.of(self.model)
        return chunked_divergence(
            request.current_hidden,
            current_head,
            frozen_hidden,
            frozen_head,
            request.kind,
            request.beta,
            request.temperature,
        ), None


def token_divergence(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    labels: torch.Tensor,
    frozen: FrozenSource,
    kind: str = "forward_kl",
    beta: float = 0.5,
    temperature: float = 1.0,
    **forward_kwargs,
) -> TokenDivergence:
    """Divergence between `frozen` and `model` (current) at every position whose next label is not -100.

    Differentiable with respect to `model` (wrap in `torch.no_grad()` to measure). `model` is the unwrapped
    model (a `PeftModel` or a `PreTrainedModel`); `forward_kwargs` pass to the backbone (e.g. `position_ids`).
    """
    mask = labels[:, 1:] != IGNORE_INDEX
    current_hidden = scored_positions(last_hidden_states(model, input_ids, attention_mask, **forward_kwargs), mask)
    head = OutputHead.of(model)
    mask = mask.to(head.weight.device)
    request = Comparison(
        model,
        current_hidden.to(head.weight.device),
        input_ids,
        attention_mask,
        mask,
        kind,
        beta,
        temperature,
        forward_kwargs,
    )
    values, bound = frozen.divergence(request)
    # masked_scatter keeps an all-masked batch connected to the graph (a differentiable zero).
    full = values.new_zeros(mask.shape).masked_scatter(mask, values)
    full_bound = None if bound is None else bound.new_zeros(mask.shape).masked_scatter(mask, bound)
    return TokenDivergence(full, mask, full_bound, request.current_hidden)
