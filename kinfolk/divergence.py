"""Token-level divergences between a frozen and a current next-token distribution, without full logits.

Everything that compares a model with its frozen self goes through here: the retained-KL callback, the
Output-KL regulariser and the ATLAS measurements. The numbers are computed from last hidden states and the
LM head in tiles of tokens × vocabulary by TRL's `ChunkedDivergenceFunction` (the kernel of its distillation
trainer), so no (tokens × vocab) fp32 logits exist at once; the current side is differentiable.

Divergences, for frozen distribution p and current distribution q at one position:
`"forward_kl"` = KL(p‖q) (what "retained KL" means), `"reverse_kl"` = KL(q‖p), `"jsd"` = TRL's generalised JSD
with mixture m = (1 − β) q + β p (β = 0.5 is the symmetric Jensen–Shannon divergence).

Positions follow TRL's label convention: `values[:, t]` compares the distributions that predict
`labels[:, t + 1]`, and only positions whose next label is not -100 count (pass `labels=input_ids` with padding
set to -100 for "all tokens").

The frozen side comes from one of five sources:

- `DisabledAdapter()`: the same PEFT model under `model.disable_adapter()` — no second copy of the weights.
- `ReferenceModel(model)`: a separate frozen model with the same vocabulary (full fine-tuning).
- `HiddenStateCache.build(...)`: the frozen model's last hidden states over a fixed set of batches, computed
  once (from the disabled adapter, the model before training, or a reference model): exact for any vocabulary,
  and a measurement then costs one forward pass plus the head kernel. The default for measuring drift.
- `ExpectationCache.build(...)`: for a frozen head without soft-capping (PEFT), the two numbers per token that
  forward KL needs (the frozen distribution's expected output embedding and negative entropy): exact, and a
  measurement costs one forward pass plus one chunked head pass, like the forward pass itself.
- `FrozenCache.build(...)`: frozen log-probs computed once over a fixed set of batches. Exact when `top_k` is
  None (sensible for small vocabularies: it stores every position × vocab). With `top_k` it keeps the k most
  likely tokens plus the tail mass r, and the forward KL it returns is that of the coarsened distributions
  (the k tokens plus one "other" bin). By the chain rule KL(p‖q) = KL_coarse + r·KL(p_tail‖q_tail), and since
  each tail probability is at most the k-th largest p_k, the omitted term lies in
  [0, r·log(min(1, p_k/r) / min_tail q_tail)]. `TokenDivergence.upper_bound` carries that bound per position.

>>> import torch
>>> from peft import LoraConfig, get_peft_model
>>> from kinfolk.testing import build_model
>>> model = get_peft_model(build_model("llama"), LoraConfig(target_modules=["q_proj"], init_lora_weights=False))
>>> ids = torch.tensor([[5, 6, 7, 8, 9]])
>>> result = token_divergence(model, ids, None, ids, frozen=DisabledAdapter())
>>> result.values.shape, int(result.mask.sum()), bool(result.mean() > 0)
(torch.Size([1, 4]), 4, True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn
from torch.utils.checkpoint import checkpoint
from trl.kernels.chunked_divergence import ChunkedDivergenceFunction
from trl.kernels.chunked_logprob import ChunkedLogProbFunction
from trl.trainer.utils import maybe_gather_lm_head_ctx

from kinfolk.atomic import atomic_file
from kinfolk.tokens import IGNORE_INDEX

DIVERGENCES = ("forward_kl", "reverse_kl", "jsd")
# Tokens handed to the kernel per call: its buffers are (tokens × 32768) fp32 tiles, so this caps their size.
DEFAULT_TOKEN_CHUNK = 1024
VOCAB_TILE = 32768  # vocabulary columns per tile in TRL's chunked log-prob kernel (its own default)


def _base(model: nn.Module) -> nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


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
        base = _base(model)
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

    def logits(self, hidden: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """fp32 logits of a few tokens after scale, soft-cap and temperature (for tiles, never a whole batch)."""
        weight = self.weight
        if hidden.is_cuda and weight.dtype in (torch.float16, torch.bfloat16):
            # fp32 products accumulated from half-precision inputs, without an fp32 copy of the whole head
            z = torch.mm(hidden.to(weight.dtype), weight.t(), out_dtype=torch.float32)
        else:
            z = hidden.float() @ weight.float().t()
        if self.bias is not None:
            z = z + self.bias.float()
        z = z * self.scale
        if self.softcap is not None:
            z = self.softcap * torch.tanh(z / self.softcap)
        return z / temperature


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


def last_hidden_states(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **forward_kwargs
) -> torch.Tensor:
    """The backbone's final (normed) hidden states, (B, T, H), through any PEFT adapters that are active."""
    outputs = _base(model).base_model(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **forward_kwargs
    )
    return outputs.last_hidden_state


def _no_tokens(hidden: torch.Tensor) -> torch.Tensor:
    # (0,) but still attached to the graph, so `backward()` on an all-masked micro-batch works.
    return hidden.float().sum(-1) * 0.0


def _beta(kind: str, beta: float) -> float:
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

    Differentiable with respect to `current_hidden` and the current head; the frozen side gets no gradient.
    """
    if current_head.weight.shape[0] != frozen_head.weight.shape[0]:
        raise ValueError(
            f"vocabularies differ: current head has {current_head.weight.shape[0]} rows, "
            f"frozen head {frozen_head.weight.shape[0]}"
        )
    if current_hidden.shape[0] != frozen_hidden.shape[0]:
        raise ValueError(f"token counts differ: {current_hidden.shape[0]} current, {frozen_hidden.shape[0]} frozen")
    beta = _beta(kind, beta)
    pieces = []
    for start in range(0, current_hidden.shape[0], token_chunk_size):
        end = start + token_chunk_size
        divergence, _ = ChunkedDivergenceFunction.apply(
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
    return torch.cat(pieces) if pieces else _no_tokens(current_hidden)


@dataclass
class TokenDivergence:
    """Per-position divergences (B, T−1), the positions that count, and for a top-k cache an upper bound."""

    values: torch.Tensor
    mask: torch.Tensor
    upper_bound: torch.Tensor | None = None

    def total(self) -> torch.Tensor:
        return self.values.sum()

    def count(self) -> torch.Tensor:
        return self.mask.sum()

    def mean(self) -> torch.Tensor:
        """Mean over the positions that count (zero when none do); keeps the graph for a regulariser."""
        return self.total() / self.count().clamp(min=1)


def batch_key(input_ids: torch.Tensor, mask: torch.Tensor) -> str:
    """Content hash of a batch's tokens and scored positions: how a `FrozenCache` finds a batch again."""
    digest = hashlib.sha256()
    for tensor in (input_ids, mask):
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
    return digest.hexdigest()[:32]


class FrozenSource:
    """Where the frozen distribution comes from; `divergence` gets the current side at the scored positions."""

    def divergence(
        self,
        model: nn.Module,
        current_hidden: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        mask: torch.Tensor,
        kind: str,
        beta: float,
        temperature: float,
        forward_kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(N,) divergences at `mask`'s positions and an optional (N,) upper bound."""
        raise NotImplementedError


def _scored(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return hidden[:, :-1][mask]


class DisabledAdapter(FrozenSource):
    """The frozen model is the PEFT model itself with its adapters switched off: no second copy in memory."""

    def divergence(
        self, model, current_hidden, input_ids, attention_mask, mask, kind, beta, temperature, forward_kwargs
    ):
        if not hasattr(model, "disable_adapter"):
            raise TypeError(
                f"DisabledAdapter needs a peft.PeftModel (with `disable_adapter()`), got {type(model).__name__}; "
                "for full fine-tuning use ReferenceModel or FrozenCache"
            )
        with torch.no_grad(), model.disable_adapter():
            frozen_hidden = _scored(last_hidden_states(model, input_ids, attention_mask, **forward_kwargs), mask)
        head = OutputHead.of(model)  # never adapted (OutputHead refuses that), so both sides share it
        return chunked_divergence(current_hidden, head, frozen_hidden, head, kind, beta, temperature), None


class ReferenceModel(FrozenSource):
    """A separate frozen model (same vocabulary) supplies the frozen distribution; it never gets gradients."""

    def __init__(self, model: nn.Module):
        self.model = model

    def divergence(
        self, model, current_hidden, input_ids, attention_mask, mask, kind, beta, temperature, forward_kwargs
    ):
        with torch.no_grad():
            frozen_hidden = _scored(last_hidden_states(self.model, input_ids, attention_mask, **forward_kwargs), mask)
        frozen_hidden = frozen_hidden.to(current_hidden.device)
        return (
            chunked_divergence(
                current_hidden, OutputHead.of(model), frozen_hidden, OutputHead.of(self.model), kind, beta, temperature
            ),
            None,
        )


def _cache_entry_divergence(
    hidden: torch.Tensor, head: OutputHead, entry: dict[str, torch.Tensor], kind: str, beta: float, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    # One token chunk: current log-probs from the chunk's logits, frozen ones from the cache.
    log_q = log_softmax(head.logits(hidden, temperature))
    if "log_probs" in entry:
        log_p = entry["log_probs"].to(log_q.device, torch.float32)
        if kind == "forward_kl":
            values = (log_p.exp() * (log_p - log_q)).sum(-1)
        elif kind == "reverse_kl":
            values = (log_q.exp() * (log_q - log_p)).sum(-1)
        else:
            log_m = torch.logaddexp(log_q + math.log(1 - beta), log_p + math.log(beta))
            values = (beta * log_p.exp() * (log_p - log_m) + (1 - beta) * log_q.exp() * (log_q - log_m)).sum(-1)
        return values, torch.zeros_like(values)
    index = entry["top_index"].to(log_q.device, torch.long)
    log_p_top = entry["top_log_probs"].to(log_q.device, torch.float32)
    log_r = entry["tail_log_mass"].to(log_q.device, torch.float32)
    log_q_top = log_q.gather(-1, index)
    log_q_rest = log_q.scatter(-1, index, -math.inf)
    log_q_tail = torch.logsumexp(log_q_rest, dim=-1)
    r = log_r.exp()
    # Zero tail mass contributes nothing (0·log 0 = 0), whatever the current tail holds.
    tail_term = torch.where(r > 0, r * (log_r - log_q_tail), torch.zeros_like(r))
    values = (log_p_top.exp() * (log_p_top - log_q_top)).sum(-1) + tail_term
    log_max_tail_share = torch.clamp(log_p_top[:, -1] - log_r, max=0.0)
    log_min_tail_q = log_q_rest.amin(-1) - log_q_tail
    bound = torch.where(r > 0, r * (log_max_tail_share - log_min_tail_q), torch.zeros_like(r)).clamp(min=0)
    return values, bound.detach()


def _frozen_hidden(model: nn.Module, batches, disable_adapter: bool = False):
    """(key, scored hidden states) for each batch, without gradients, optionally with the adapters switched off."""
    with torch.no_grad(), model.disable_adapter() if disable_adapter else contextlib.nullcontext():
        for batch in batches:
            input_ids, attention_mask, labels = batch["input_ids"], batch.get("attention_mask"), batch["labels"]
            mask = labels[:, 1:] != IGNORE_INDEX
            hidden = last_hidden_states(model, input_ids, attention_mask)
            yield batch_key(input_ids, mask), _scored(hidden, mask.to(hidden.device))


class _BatchCache(FrozenSource):
    """Frozen data per batch, found again by a hash of the batch's tokens and scored positions."""

    def __init__(self, entries: dict[str, dict[str, torch.Tensor]] | None = None):
        self.entries = entries or {}

    def __len__(self) -> int:
        return len(self.entries)

    def _lookup(self, input_ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        key = batch_key(input_ids, mask)
        if key not in self.entries:
            raise KeyError(
                f"batch {key} (shape {tuple(input_ids.shape)}) is not in the frozen cache of {len(self)} batches; "
                "a cache only covers the exact batches it was built from"
            )
        return self.entries[key]

    def _metadata(self) -> dict[str, str]:
        return {}

    def save(self, path: str | Path) -> Path:
        """One safetensors file, written atomically; `type(self).load(path)` reads it back."""
        tensors = {
            f"{key}.{name}": tensor.contiguous()
            for key, entry in self.entries.items()
            for name, tensor in entry.items()
        }
        with atomic_file(path, mode="wb", encoding=None) as handle:
            handle.write(save_safetensors(tensors, metadata={"kind": type(self).__name__, **self._metadata()}))
        return Path(path)

    @classmethod
    def load(cls, path: str | Path):
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        if metadata.get("kind") != cls.__name__:
            raise ValueError(f"{path} holds a {metadata.get('kind', 'unknown')} cache, not a {cls.__name__}")
        entries: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in load_safetensors(Path(path).read_bytes()).items():
            key, field = name.split(".", 1)
            entries.setdefault(key, {})[field] = tensor
        return cls._from_saved(entries, metadata)

    @classmethod
    def _from_saved(cls, entries, metadata):
        raise NotImplementedError


class HiddenStateCache(_BatchCache):
    """The frozen model's last hidden states at the scored positions, computed once: exact for any vocabulary.

    Each later measurement then costs one forward of the current model plus the chunked head kernel, instead of
    two forwards. Memory: (scored tokens × hidden size) in the model's dtype, on `device`. Build it from the
    model before training (`disable_adapter=True` for a PEFT model: no second copy) or from a reference model.
    When the head can change (full fine-tuning), a copy of it is kept as the frozen head; a frozen head (PEFT)
    is read from the model at each use.
    """

    HEAD = "frozen_head"  # entry name of the head copy; batch keys are hex digests, so it cannot clash

    def __init__(self, entries=None, head: OutputHead | None = None):
        super().__init__(entries)
        self.head = head

    @classmethod
    def build(
        cls,
        model: nn.Module,
        batches,
        disable_adapter: bool = False,
        copy_head: bool | None = None,
        device: str | torch.device = "cpu",
    ) -> HiddenStateCache:
        """`copy_head=None` copies the head only when any of its parameters is trainable."""
        entries = {
            key: {"hidden": hidden.to(device)} for key, hidden in _frozen_hidden(model, batches, disable_adapter)
        }
        head = OutputHead.of(model)
        trainable = head.weight.requires_grad or (head.bias is not None and head.bias.requires_grad)
        if copy_head or (copy_head is None and trainable):
            with maybe_gather_lm_head_ctx(head.weight, head.bias):
                head = dataclasses.replace(
                    head,
                    weight=head.weight.detach().clone(),
                    bias=None if head.bias is None else head.bias.detach().clone(),
                )
            return cls(entries, head)
        return cls(entries)

    def divergence(
        self, model, current_hidden, input_ids, attention_mask, mask, kind, beta, temperature, forward_kwargs
    ):
        frozen_hidden = self._lookup(input_ids, mask)["hidden"].to(current_hidden.device, non_blocking=True)
        current_head = OutputHead.of(model)
        if self.head is not None and self.head.weight.device != current_head.weight.device:
            self.head = dataclasses.replace(
                self.head,
                weight=self.head.weight.to(current_head.weight.device),
                bias=None if self.head.bias is None else self.head.bias.to(current_head.weight.device),
            )
        frozen_head = self.head or current_head
        return chunked_divergence(
            current_hidden, current_head, frozen_hidden, frozen_head, kind, beta, temperature
        ), None

    def save(self, path: str | Path) -> Path:
        if self.head is not None:
            head = {"weight": self.head.weight.cpu()}
            if self.head.bias is not None:
                head["bias"] = self.head.bias.cpu()
            self.entries[self.HEAD] = head
        try:
            return super().save(path)
        finally:
            self.entries.pop(self.HEAD, None)

    def _metadata(self):
        if self.head is None:
            return {}
        return {
            "scale": repr(self.head.scale),
            "softcap": "" if self.head.softcap is None else repr(self.head.softcap),
        }

    @classmethod
    def _from_saved(cls, entries, metadata):
        saved = entries.pop(cls.HEAD, None)
        if saved is None:
            return cls(entries)
        softcap = metadata.get("softcap", "")
        head = OutputHead(
            saved["weight"], saved.get("bias"), float(metadata["scale"]), float(softcap) if softcap else None
        )
        return cls(entries, head)


class ExpectationCache(_BatchCache):
    """Exact forward KL(frozen‖current) at the cost of one head projection, for a frozen head without soft-cap.

    With logits z = (s/T)(W h + b) and the head shared by both sides (a PEFT model whose head is not adapted),
    KL(p‖q) = Σ p log p − Σ_v p_v z_q,v + log Z_q, and Σ_v p_v z_q,v = (s/T)(h_q · Wᵀp + bᵀp). So per scored
    token the cache keeps the H-vector m = Wᵀp and the scalar c = Σ p log p − (s/T) bᵀp; a measurement is then
    c − (s/T) h_q·m + log Z_q, with log Z_q from TRL's chunked log-prob kernel: one forward pass plus one
    projection that never materialises the logits, and differentiable. Memory: (scored tokens × H) fp32.
    Soft-capped heads (Gemma 2) are not linear in h: use `HiddenStateCache` there.
    """

    def __init__(self, entries=None, scale: float = 1.0, temperature: float = 1.0):
        super().__init__(entries)
        self.scale = scale
        self.temperature = temperature

    @staticmethod
    def _check_head(head: OutputHead) -> None:
        if head.softcap is not None:
            raise ValueError("ExpectationCache needs a head without soft-capping; use HiddenStateCache for this model")
        if head.weight.requires_grad or (head.bias is not None and head.bias.requires_grad):
            raise ValueError("ExpectationCache needs a frozen head shared by both sides; the head here is trainable")

    @classmethod
    def build(
        cls,
        model: nn.Module,
        batches,
        disable_adapter: bool = False,
        temperature: float = 1.0,
        token_chunk_size: int = 256,
    ) -> ExpectationCache:
        head = OutputHead.of(model)
        cls._check_head(head)
        cache = cls(scale=head.scale, temperature=temperature)
        factor = head.scale / temperature
        for key, hidden in _frozen_hidden(model, batches, disable_adapter):
            moments, constants = [], []
            with torch.no_grad(), maybe_gather_lm_head_ctx(head.weight, head.bias):
                weight = head.weight.float()  # m = Wᵀp needs fp32 throughout: an error in m is an error in KL
                for start in range(0, max(hidden.shape[0], 1), token_chunk_size):
                    log_p = log_softmax(head.logits(hidden[start : start + token_chunk_size], temperature))
                    p = log_p.exp()
                    constant = (p * log_p).sum(-1, dtype=torch.float64)
                    if head.bias is not None:
                        constant -= factor * (p @ head.bias.float())
                    constant = constant.float()
                    moments.append(p @ weight)
                    constants.append(constant)
            cache.entries[key] = {"moment": torch.cat(moments), "constant": torch.cat(constants)}
        return cache

    def divergence(
        self, model, current_hidden, input_ids, attention_mask, mask, kind, beta, temperature, forward_kwargs
    ):
        if kind != "forward_kl":
            raise ValueError(f"ExpectationCache gives forward_kl only, not {kind!r}; use HiddenStateCache")
        if temperature != self.temperature:
            raise ValueError(f"the frozen cache was built at temperature {self.temperature}, not {temperature}")
        head = OutputHead.of(model)
        self._check_head(head)
        if head.scale != self.scale:
            raise ValueError(f"the model's logit scale {head.scale} differs from the cached {self.scale}")
        entry = self._lookup(input_ids, mask)
        moment = entry["moment"].to(current_hidden.device, non_blocking=True)
        constant = entry["constant"].to(current_hidden.device, non_blocking=True)
        factor = head.scale / temperature
        pieces = []
        with maybe_gather_lm_head_ctx(head.weight, head.bias):
            for start in range(0, current_hidden.shape[0], DEFAULT_TOKEN_CHUNK):
                hidden = current_hidden[start : start + DEFAULT_TOKEN_CHUNK]
                # log Z = z_0 − log q(0): the kernel's log-prob of token 0 carries the log-normaliser
                first = torch.zeros(hidden.shape[0], dtype=torch.long, device=hidden.device)
                log_q_first = ChunkedLogProbFunction.apply(
                    hidden, head.weight, head.bias, first, temperature, VOCAB_TILE, None, head.scale, ()
                )[0]
                z_first = factor * (hidden.float() @ head.weight[0].float())
                expected = factor * (hidden.float() * moment[start : start + DEFAULT_TOKEN_CHUNK]).sum(-1)
                if head.bias is not None:
                    z_first = z_first + factor * head.bias[0].float()
                pieces.append(constant[start : start + DEFAULT_TOKEN_CHUNK] - expected + z_first - log_q_first)
        return (torch.cat(pieces) if pieces else _no_tokens(current_hidden)), None

    def _metadata(self):
        return {"scale": repr(self.scale), "temperature": repr(self.temperature)}

    @classmethod
    def _from_saved(cls, entries, metadata):
        return cls(entries, float(metadata.get("scale", "1.0")), float(metadata.get("temperature", "1.0")))


class FrozenCache(_BatchCache):
    """Frozen log-probs computed once per batch, for full fine-tuning without a second model in memory.

    `top_k=None` stores every position × vocab log-prob (exact; all three divergences). With `top_k` it stores
    the k largest log-probs, their token ids and the log tail mass; only `"forward_kl"` is available then, and
    `TokenDivergence.upper_bound` gives the bound on what the tail can add (see the module docstring).
    """

    def __init__(
        self,
        entries: dict[str, dict[str, torch.Tensor]] | None = None,
        top_k: int | None = None,
        temperature: float = 1.0,
    ):
        super().__init__(entries)
        self.top_k = top_k
        self.temperature = temperature

    @classmethod
    def build(
        cls,
        model: nn.Module,
        batches,
        top_k: int | None = None,
        temperature: float = 1.0,
        disable_adapter: bool = False,
        token_chunk_size: int = DEFAULT_TOKEN_CHUNK,
    ) -> FrozenCache:
        """Run `model` (frozen, no gradients) over `batches` of dicts with input_ids, attention_mask, labels."""
        cache = cls(top_k=top_k, temperature=temperature)
        head = OutputHead.of(model)
        for key, hidden in _frozen_hidden(model, batches, disable_adapter):
            # At least one (possibly empty) chunk, so an all-masked batch still gets an entry of the right shape.
            with torch.no_grad(), maybe_gather_lm_head_ctx(head.weight, head.bias):
                parts = [
                    cache._entry(log_softmax(head.logits(hidden[start : start + token_chunk_size], temperature)))
                    for start in range(0, max(hidden.shape[0], 1), token_chunk_size)
                ]
            cache.entries[key] = {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
        return cache

    def _entry(self, log_p: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.top_k is None:
            return {"log_probs": log_p.cpu()}
        if not 0 < self.top_k < log_p.shape[-1]:
            raise ValueError(f"top_k must lie in 1..{log_p.shape[-1] - 1} for a vocabulary of {log_p.shape[-1]}")
        top = log_p.topk(self.top_k, dim=-1)
        tail = torch.logsumexp(log_p.scatter(-1, top.indices, -math.inf), dim=-1)
        return {
            "top_log_probs": top.values.cpu(),
            "top_index": top.indices.to(torch.int32).cpu(),
            "tail_log_mass": tail.cpu(),
        }

    def divergence(
        self, model, current_hidden, input_ids, attention_mask, mask, kind, beta, temperature, forward_kwargs
    ):
        entry = self._lookup(input_ids, mask)
        if temperature != self.temperature:
            raise ValueError(f"the frozen cache was built at temperature {self.temperature}, not {temperature}")
        if self.top_k is not None and kind != "forward_kl":
            raise ValueError(f"a top-k frozen cache supports forward_kl only, not {kind!r}; build it with top_k=None")
        beta = _beta(kind, beta)
        head = OutputHead.of(model)
        values, bounds = [], []
        for start in range(0, current_hidden.shape[0], DEFAULT_TOKEN_CHUNK):
            piece = {name: tensor[start : start + DEFAULT_TOKEN_CHUNK] for name, tensor in entry.items()}

            def run(hidden, piece=piece):
                with maybe_gather_lm_head_ctx(head.weight, head.bias):
                    return _cache_entry_divergence(hidden, head, piece, kind, beta, temperature)

            chunk = current_hidden[start : start + DEFAULT_TOKEN_CHUNK]
            # Recompute the chunk's logits in backward rather than keeping every chunk's (tokens × vocab) alive.
            value, bound = checkpoint(run, chunk, use_reentrant=False) if torch.is_grad_enabled() else run(chunk)
            values.append(value)
            bounds.append(bound)
        if not values:
            empty = _no_tokens(current_hidden)
            return empty, (empty.detach() if self.top_k is not None else None)
        return torch.cat(values), (torch.cat(bounds) if self.top_k is not None else None)

    def _metadata(self):
        return {"top_k": "" if self.top_k is None else str(self.top_k), "temperature": repr(self.temperature)}

    @classmethod
    def _from_saved(cls, entries, metadata):
        top_k = metadata.get("top_k", "")
        return cls(entries, int(top_k) if top_k else None, float(metadata.get("temperature", "1.0")))


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
    current_hidden = _scored(last_hidden_states(model, input_ids, attention_mask, **forward_kwargs), mask)
    head = OutputHead.of(model)
    mask = mask.to(head.weight.device)
    values, bound = frozen.divergence(
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
    # masked_scatter keeps an all-masked batch connected to the graph (a differentiable zero).
    full = values.new_zeros(mask.shape).masked_scatter(mask, values)
    full_bound = None if bound is None else bound.new_zeros(mask.shape).masked_scatter(mask, bound)
    return TokenDivergence(full, mask, full_bound)
