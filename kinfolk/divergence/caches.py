"""Frozen sources computed once over a fixed set of batches, found again by a hash of each batch, saved to disk.

`HiddenStateCache` (frozen last hidden states: exact for any vocabulary), `ExpectationCache` (two numbers per token
that exact forward KL needs, for a frozen head without soft-capping) and `FrozenCache` (frozen log-probs, whole or
top-k with an error bound). See the package docstring for when each is the right one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn
from torch.utils.checkpoint import checkpoint

from kinfolk.atomic import atomic_file
from kinfolk.divergence.kernels import (
    DEFAULT_TOKEN_CHUNK,
    OutputHead,
    chunked_divergence,
    last_hidden_states,
    log_normaliser,
    log_softmax,
    mixture_beta,
    no_tokens,
)
from kinfolk.divergence.sources import Comparison, FrozenSource, scored_positions
from kinfolk.sharding import gathered_for_reading
from kinfolk.tokens import IGNORE_INDEX


def batch_key(input_ids: torch.Tensor, mask: torch.Tensor) -> str:
    """Content hash of a batch's tokens and scored positions: how a `FrozenCache` finds a batch again."""
    digest = hashlib.sha256()
    for tensor in (input_ids, mask):
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
    return digest.hexdigest()[:32]


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
            yield batch_key(input_ids, mask), scored_positions(hidden, mask.to(hidden.device))


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
        if copy_head or (copy_head is None and head.trainable):
            with gathered_for_reading(head.weight, head.bias):
                head = dataclasses.replace(
                    head,
                    weight=head.weight.detach().clone(),
                    bias=None if head.bias is None else head.bias.detach().clone(),
                )
            return cls(entries, head)
        return cls(entries)

    def divergence(self, request: Comparison):
        model, current_hidden = request.model, request.current_hidden
        frozen_hidden = self._lookup(request.input_ids, request.mask)["hidden"].to(
            current_hidden.device, non_blocking=True
        )
        current_head = OutputHead.of(model)
        if self.head is not None and self.head.weight.device != current_head.weight.device:
            self.head = dataclasses.replace(
                self.head,
                weight=self.head.weight.to(current_head.weight.device),
                bias=None if self.head.bias is None else self.head.bias.to(current_head.weight.device),
            )
        frozen_head = self.head or current_head
        return chunked_divergence(
            current_hidden, current_head, frozen_hidden, frozen_head, request.kind, request.beta, request.temperature
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


def _dot(hidden: torch.Tensor, moment: torch.Tensor) -> torch.Tensor:
    """Row-wise h·m in float64, differentiable in `hidden`."""
    return (hidden.double() * moment.to(hidden.device, torch.float64)).sum(-1)


class ExpectationCache(_BatchCache):
    """Exact forward KL(frozen‖current) at the cost of one head projection, for a frozen head without soft-cap.

    With logits z = (s/T)(W h + b) and the head shared by both sides (a PEFT model whose head is not adapted),
    KL(p‖q) = Σ_v p_v (z_p,v − z_q,v) + log Z_q − log Z_p = (s/T)(h_p − h_q)·Wᵀp + log Z_q − log Z_p (the bias
    cancels). So per scored token the cache keeps the H-vector m = Wᵀp and the scalar c = (s/T) h_p·m − log Z_p;
    a measurement is c − (s/T) h_q·m + log Z_q: one forward pass plus one tiled head pass that never materialises
    the logits, and differentiable. c, h_q·m and log Z are float64: they are ~20–30 on real models, where fp32
    would leave a floor of ~1e-6 under every KL (what an identity adapter measured). Memory: (scored tokens × H)
    fp32 plus one float64 per token. Soft-capped heads (Gemma 2) are not linear in h: use `HiddenStateCache`.
    """

    FORM = "log-normaliser"  # what "constant" holds; caches saved before it was float64 c − log Z_p are refused

    def __init__(self, entries=None, scale: float = 1.0, temperature: float = 1.0):
        super().__init__(entries)
        self.scale = scale
        self.temperature = temperature

    @staticmethod
    def _check_head(head: OutputHead) -> None:
        if head.softcap is not None:
            raise ValueError("ExpectationCache needs a head without soft-capping; use HiddenStateCache for this model")
        if head.trainable:
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
            moments = []
            with torch.no_grad(), gathered_for_reading(head.weight, head.bias):
                weight = head.weight.float()  # m = Wᵀp needs fp32 throughout: an error in m is an error in KL
                for start in range(0, max(hidden.shape[0], 1), token_chunk_size):
                    p = log_softmax(head.logits(hidden[start : start + token_chunk_size], temperature)).exp()
                    moments.append(p @ weight)
                moment = torch.cat(moments)
                # the measurement's own float64 terms on the frozen side: equal hidden states give exactly 0
                constant = factor * _dot(hidden, moment) - log_normaliser(hidden, head, temperature)
            cache.entries[key] = {"moment": moment, "constant": constant}
        return cache

    def divergence(self, request: Comparison):
        model, current_hidden, kind, temperature = (
            request.model,
            request.current_hidden,
            request.kind,
            request.temperature,
        )
        if kind != "forward_kl":
            raise ValueError(f"ExpectationCache gives forward_kl only, not {kind!r}; use HiddenStateCache")
        if temperature != self.temperature:
            raise ValueError(f"the frozen cache was built at temperature {self.temperature}, not {temperature}")
        head = OutputHead.of(model)
        self._check_head(head)
        if head.scale != self.scale:
            raise ValueError(f"the model's logit scale {head.scale} differs from the cached {self.scale}")
        entry = self._lookup(request.input_ids, request.mask)
        moment = entry["moment"].to(current_hidden.device, non_blocking=True)
        constant = entry["constant"].to(current_hidden.device, non_blocking=True)
        factor = head.scale / temperature
        if current_hidden.shape[0] == 0:
            return no_tokens(current_hidden), None
        with gathered_for_reading(head.weight, head.bias):
            values = (
                constant - factor * _dot(current_hidden, moment) + log_normaliser(current_hidden, head, temperature)
            )
        return values.float(), None  # a difference of float64 terms: fp32 keeps it to 6e-8 relative

    def _metadata(self):
        return {"scale": repr(self.scale), "temperature": repr(self.temperature), "form": self.FORM}

    @classmethod
    def _from_saved(cls, entries, metadata):
        if metadata.get("form") != cls.FORM:
            raise ValueError("this ExpectationCache was saved by an older kinfolk (fp32 terms); build it again")
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
            with torch.no_grad(), gathered_for_reading(head.weight, head.bias):
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

    def divergence(self, request: Comparison):
        model, current_hidden, kind, temperature = (
            request.model,
            request.current_hidden,
            request.kind,
            request.temperature,
        )
        entry = self._lookup(request.input_ids, request.mask)
        if temperature != self.temperature:
            raise ValueError(f"the frozen cache was built at temperature {self.temperature}, not {temperature}")
        if self.top_k is not None and kind != "forward_kl":
            raise ValueError(f"a top-k frozen cache supports forward_kl only, not {kind!r}; build it with top_k=None")
        beta = mixture_beta(kind, request.beta)
        head = OutputHead.of(model)
        values, bounds = [], []
        for start in range(0, current_hidden.shape[0], DEFAULT_TOKEN_CHUNK):
            piece = {name: tensor[start : start + DEFAULT_TOKEN_CHUNK] for name, tensor in entry.items()}

            def run(hidden, piece=piece):
                with gathered_for_reading(head.weight, head.bias):
                    return _cache_entry_divergence(hidden, head, piece, kind, beta, temperature)

            chunk = current_hidden[start : start + DEFAULT_TOKEN_CHUNK]
            # Recompute the chunk's logits in backward rather than keeping every chunk's (tokens × vocab) alive.
            value, bound = checkpoint(run, chunk, use_reentrant=False) if torch.is_grad_enabled() else run(chunk)
            values.append(value)
            bounds.append(bound)
        if not values:
            empty = no_tokens(current_hidden)
            return empty, (empty.detach() if self.top_k is not None else None)
        return torch.cat(values), (torch.cat(bounds) if self.top_k is not None else None)

    def _metadata(self):
        return {"top_k": "" if self.top_k is None else str(self.top_k), "temperature": repr(self.temperature)}

    @classmethod
    def _from_saved(cls, entries, metadata):
        top_k = metadata.get("top_k", "")
        return cls(entries, int(top_k) if top_k else None, float(metadata.get("temperature", "1.0")))
