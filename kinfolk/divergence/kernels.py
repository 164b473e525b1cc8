"""The divergence kernels: an LM head as the kernels see it, float64 normalisers, and TRL's chunked divergence.

Nothing here knows where the frozen distribution comes from (`sources`, `caches`): these functions take hidden
states and heads and never build a (tokens × vocab) fp32 logit matrix at once (on TRL 1.14, which has no chunked
kernel, `kinfolk.compat.trl` builds one per token chunk).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kinfolk.compat.trl import chunked_divergence_function
from kinfolk.layout import base_model
from kinfolk.sharding import gathered_for_reading

DIVERGENCES = ("forward_kl", "reverse_kl", "jsd")
# Tokens handed to the kernel per call: its buffers are (tokens × 32768) fp32 tiles, so this caps their size.
DEFAULT_TOKEN_CHUNK = 1024
VOCAB_TILE = 32768  # vocabulary columns per tile in TRL's chunked log-prob kernel (its own default)


def logit_scale(text_config) -> float:
    """The multiplier a model applies to its logits before soft-capping, read the way TRL's fused head reads it."""
    scale = getattr(text_config, "logit_scale", None)
    if scale is None:
        scale = getattr(text_config, "output_multiplier", None)
    if scale is None:
        scale = getattr(text_config, "lm_head_multiplier", None)
    if scale is None and getattr(text_config, "logits_scaling", None) is not None:
        scaling = text_config.logits_scaling
        scale = scaling if text_config.model_type == "hyperclovax" else 1 / scaling
    return 1.0 if scale is None else float(scale)


@dataclass(frozen=True)
class OutputHead:
    """An LM head as the divergence kernels need it: weight (V, H), optional bias, logit scale and soft-cap."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    scale: float = 1.0
    softcap: float | None = None

    @classmethod
    def of(cls, model: nn.Module) -> OutputHead:
        base = base_model(model)
        head = base.get_output_embeddings()
        if head is None or hasattr(head, "base_layer"):
            raise NotImplementedError(
                f"{type(base).__name__}'s output head is {'missing' if head is None else 'adapted by PEFT'}; "
                "divergences read the head's weight directly, so leave `lm_head` out of the adapter's target_modules"
            )
        weight, bias = head.weight, getattr(head, "bias", None)
        if isinstance(weight, torch.distributed.tensor.DTensor):  # FSDP2: gather the head once, not per tile
            weight = weight.full_tensor()
            bias = bias.full_tensor() if bias is not None else None
        config = base.config.get_text_config()
        return cls(weight, bias, logit_scale(config), getattr(config, "final_logit_softcapping", None))

    @property
    def trainable(self) -> bool:
        """Whether training can change the head (then a frozen side needs its own copy)."""
        return self.weight.requires_grad or (self.bias is not None and self.bias.requires_grad)

    def logits(self, hidden: torch.Tensor, temperature: float = 1.0, vocab: slice = slice(None)) -> torch.Tensor:
        """fp32 logits of a few tokens after scale, soft-cap and temperature (for tiles, never a whole batch);
        `vocab` selects a tile of the vocabulary."""
        weight = self.weight[vocab]
        if hidden.is_cuda and weight.dtype in (torch.float16, torch.bfloat16):
            # fp32 products accumulated from half-precision inputs, without an fp32 copy of the whole head
            z = torch.mm(hidden.to(weight.dtype), weight.t(), out_dtype=torch.float32)
        else:
            z = hidden.float() @ weight.float().t()
        return self._transformed(z, None if self.bias is None else self.bias[vocab], temperature)

    def label_logits(self, hidden: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """(N,) fp32 logits of one vocabulary entry per token (`labels` (N,)), transformed as `logits` does.

        >>> head = OutputHead(torch.randn(10, 4), torch.randn(10), scale=0.5, softcap=3.0)
        >>> hidden, labels = torch.randn(3, 4), torch.tensor([1, 7, 7])
        >>> bool(torch.allclose(head.label_logits(hidden, labels), head.logits(hidden)[torch.arange(3), labels]))
        True
        """
        z = (hidden.float() * self.weight[labels].float()).sum(-1)
        return self._transformed(z, None if self.bias is None else self.bias[labels], temperature)

    def _transformed(self, z: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
        # bias, scale, soft-cap, temperature; the multiplications by one are skipped (full passes over the tile)
        if bias is not None:
            z = z + bias.float()
        if self.scale != 1.0:
            z = z * self.scale
        if self.softcap is not None:
            z = self.softcap * torch.tanh(z / self.softcap)
        return z / temperature if temperature != 1.0 else z


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """fp32 log-probs over the last dimension whose normaliser is accumulated in float64.

    `torch.log_softmax` sums the exponentials in fp32: over a 262k vocabulary the many small terms are partly
    lost and the probabilities come out summing to about 1 + 5e-5. That is harmless for one log-prob, but a
    frozen distribution's expectations (`ExpectationCache`'s Σ p·z with |z| ~ 20) then carry the error
    times the logits' size, which rivals a retained KL of 1e-3.

    >>> logits = torch.randn(2, 262144) * 4
    >>> error = lambda log_p: (log_p.exp().sum(-1, dtype=torch.float64) - 1).abs().max().item()
    >>> error(log_softmax(logits)) < 1e-6
    True
    """
    shifted = logits - logits.amax(-1, keepdim=True)
    return shifted - shifted.exp().sum(-1, keepdim=True, dtype=torch.float64).log().to(logits.dtype)


class _LogNormaliser(torch.autograd.Function):
    """log Σ_v exp(z_v) per token in float64, from fp32 logit tiles of (tokens × VOCAB_TILE); frozen head.

    fp32 cannot hold it to better than ~2e-6 (its size is ~28 on SmolLM2), and `ExpectationCache` subtracts two
    of them to get KLs far smaller than that. The backward pass recomputes the tiles: only the hidden states get a
    gradient, (s/T)·Wᵀq.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, head: OutputHead, temperature: float) -> torch.Tensor:
        peaks, sums = [], []
        for start in range(0, head.weight.shape[0], VOCAB_TILE):
            z = head.logits(hidden, temperature, slice(start, start + VOCAB_TILE))
            peak = z.amax(-1, keepdim=True)
            peaks.append(peak.double())
            sums.append(z.sub_(peak).exp_().sum(-1, keepdim=True, dtype=torch.float64))
        peaks, sums = torch.cat(peaks, -1), torch.cat(sums, -1)
        top = peaks.amax(-1, keepdim=True)
        log_normaliser = (top + (sums * (peaks - top).exp()).sum(-1, keepdim=True).log()).squeeze(-1)
        ctx.save_for_backward(hidden, log_normaliser)
        ctx.head, ctx.temperature = head, temperature
        return log_normaliser

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        hidden, log_normaliser = ctx.saved_tensors
        head, temperature = ctx.head, ctx.temperature
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
        shift = log_normaliser.float().unsqueeze(-1)
        for start in range(0, head.weight.shape[0], VOCAB_TILE):
            tile = slice(start, start + VOCAB_TILE)
            q = head.logits(hidden, temperature, tile).sub_(shift).exp_()
            grad_hidden += q @ head.weight[tile].float()
        grad_hidden *= (head.scale / temperature) * grad.float().unsqueeze(-1)
        return grad_hidden.to(hidden.dtype), None, None


def log_normaliser(hidden: torch.Tensor, head: OutputHead, temperature: float = 1.0) -> torch.Tensor:
    """(N,) float64 log-normalisers of a frozen head's logits for (N, H) hidden states, differentiable in them.

    Tokens go through in chunks of DEFAULT_TOKEN_CHUNK, so equal hidden states give bit-equal results.

    >>> head = OutputHead(torch.randn(50000, 64), None)  # two vocabulary tiles
    >>> hidden = torch.randn(3, 64)
    >>> exact = torch.logsumexp(hidden.double() @ head.weight.double().t(), -1)
    >>> bool((log_normaliser(hidden, head) - exact).abs().max() < 1e-5)
    True
    """
    pieces = [
        _LogNormaliser.apply(hidden[start : start + DEFAULT_TOKEN_CHUNK], head, temperature)
        for start in range(0, hidden.shape[0], DEFAULT_TOKEN_CHUNK)
    ]
    return torch.cat(pieces) if pieces else hidden.new_zeros(0, dtype=torch.float64)


def label_log_probs_from_hidden(hidden: torch.Tensor, labels: torch.Tensor, head: OutputHead) -> torch.Tensor:
    """(N,) float64 log-probs of `labels` (N,) under the head, from (N, H) hidden states of the scored positions
    only: the label's logit minus the float64 `log_normaliser`, never a (tokens × vocab) matrix at once.

    >>> head = OutputHead(torch.randn(50000, 64), None)
    >>> hidden, labels = torch.randn(3, 64), torch.tensor([0, 49999, 7])
    >>> exact = torch.log_softmax(hidden.double() @ head.weight.double().t(), -1)[torch.arange(3), labels]
    >>> bool((label_log_probs_from_hidden(hidden, labels, head) - exact).abs().max() < 1e-5)
    True
    """
    return head.label_logits(hidden, labels).double() - log_normaliser(hidden, head)


def last_hidden_states(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **forward_kwargs
) -> torch.Tensor:
    """The backbone's final (normed) hidden states, (B, T, H), through any PEFT adapters that are active."""
    outputs = base_model(model).base_model(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **forward_kwargs
    )
    return outputs.last_hidden_state


def no_tokens(hidden: torch.Tensor) -> torch.Tensor:
    # (0,) but still attached to the graph, so `backward()` on an all-masked micro-batch works.
    return hidden.float().sum(-1) * 0.0


def mixture_beta(kind: str, beta: float) -> float:
    """The β TRL's kernel takes for a divergence: 0 for forward KL, 1 for reverse KL, `beta` for the JSD."""
    if kind not in DIVERGENCES:
        raise ValueError(f"unknown divergence {kind!r}; choose one of {', '.join(DIVERGENCES)}")
    if kind == "jsd" and not 0.0 < beta < 1.0:
        raise ValueError(f"jsd needs 0 < beta < 1, got {beta}")
    return {"forward_kl": 0.0, "reverse_kl": 1.0}.get(kind, beta)


def chunked_divergence(
    current_hidden: torch.Tensor,
    current_head: OutputHead,
    frozen_hidden: torch.Tensor,
    frozen_head: OutputHead,
    kind: str = "forward_kl",
    beta: float = 0.5,
    temperature: float = 1.0,
    token_chunk_size: int = DEFAULT_TOKEN_CHUNK,
) -> torch.Tensor:
    """Per-token divergence (N,) between frozen and current distributions given (N, H) hidden states.

    Differentiable with respect to `current_hidden` and the current head; the frozen side gets no gradient. Under
    ZeRO-3 each head read here, outside its module's forward, is gathered whole for the call (a measurement's use).
    """
    heads = (current_head.weight, current_head.bias, frozen_head.weight, frozen_head.bias)
    with gathered_for_reading(*heads):
        return _chunked_divergence(
            current_hidden, current_head, frozen_hidden, frozen_head, kind, beta, temperature, token_chunk_size
        )


def _chunked_divergence(
    current_hidden: torch.Tensor,
    current_head: OutputHead,
    frozen_hidden: torch.Tensor,
    frozen_head: OutputHead,
    kind: str,
    beta: float,
    temperature: float,
    token_chunk_size: int,
) -> torch.Tensor:
    if current_head.weight.shape[0] != frozen_head.weight.shape[0]:
        raise ValueError(
            f"vocabularies differ: current head has {current_head.weight.shape[0]} rows, "
            f"frozen head {frozen_head.weight.shape[0]}"
        )
    if current_hidden.shape[0] != frozen_hidden.shape[0]:
        raise ValueError(f"token counts differ: {current_hidden.shape[0]} current, {frozen_hidden.shape[0]} frozen")
    beta = mixture_beta(kind, beta)
    divergence_function = chunked_divergence_function()
    pieces = []
    for start in range(0, current_hidden.shape[0], token_chunk_size):
        end = start + token_chunk_size
        divergence, _ = divergence_function(
            current_hidden[start:end],
            current_head.weight,
            current_head.bias,
            frozen_hidden[start:end].detach(),
            frozen_head.weight.detach(),
            None if frozen_head.bias is None else frozen_head.bias.detach(),
            beta,
            temperature,
            current_head.scale,
            current_head.softcap,
            frozen_head.scale,
            frozen_head.softcap,
        )
        pieces.append(divergence)
    return torch.cat(pieces) if pieces else no_tokens(current_hidden)
