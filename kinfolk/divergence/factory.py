"""`frozen_source`: the one place that decides what a measurement during training compares the model with.

- a separate `reference_model`: it is the frozen model;
- a PEFT model: its own adapters switched off (no second copy of the weights);
- full fine-tuning: the model as it is when training starts, cached (to `saved`, so a resumed run measures against
  the same frozen model once the starting weights are gone).

`cache="auto"` picks `"expectation"` where it is exact (forward KL, a PEFT model whose head is frozen and not
soft-capped: one head projection per measurement) and `"hidden"` otherwise; `"log_probs"` stores frozen log-probs
(exact, or top-k with an error bound); `"none"` recomputes the frozen side at every measurement.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from kinfolk.divergence.caches import ExpectationCache, FrozenCache, HiddenStateCache
from kinfolk.divergence.kernels import OutputHead
from kinfolk.divergence.sources import DisabledAdapter, FrozenSource, ReferenceModel

CACHES = ("auto", "expectation", "hidden", "log_probs", "none")


@dataclass(frozen=True)
class FrozenSide:
    """The chosen frozen source, the cache kind it uses and what the frozen model is, in words (for logs)."""

    source: FrozenSource
    cache: str
    description: str


def cache_kind(
    model: nn.Module, cache: str = "auto", reference_model: nn.Module | None = None, divergence: str = "forward_kl"
) -> str:
    """`cache` itself, or for "auto" the exact cache that costs least for this model and divergence."""
    if cache != "auto":
        return cache
    head = OutputHead.of(model)
    is_peft = hasattr(model, "disable_adapter")
    if (
        is_peft
        and reference_model is None
        and divergence == "forward_kl"
        and not head.trainable
        and head.softcap is None
    ):
        return "expectation"
    return "hidden"


def _build(kind: str, model: nn.Module, batches, top_k: int | None, disable_adapter: bool) -> FrozenSource:
    if kind == "expectation":
        return ExpectationCache.build(model, batches, disable_adapter=disable_adapter)
    if kind == "hidden":
        return HiddenStateCache.build(model, batches, disable_adapter=disable_adapter)
    return FrozenCache.build(model, batches, top_k, disable_adapter=disable_adapter)


def frozen_source(
    model: nn.Module,
    batches: Iterable[dict[str, torch.Tensor]],
    cache: str = "auto",
    *,
    reference_model: nn.Module | None = None,
    divergence: str = "forward_kl",
    top_k: int | None = None,
    saved: str | Path | None = None,
    resume_step: int = 0,
) -> FrozenSide:
    """The frozen side for measuring `model` (unwrapped) on `batches` (on the head's device; consumed only when a
    cache is built). `top_k` applies to `cache="log_probs"`. For full fine-tuning, the starting model's cache is
    written to `saved`, and read back from it when resuming (`resume_step > 0`)."""
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
    kind = cache_kind(model, cache, reference_model, divergence)
    with torch.no_grad():
        if reference_model is not None:
            if kind == "none":
                source = ReferenceModel(reference_model)
            elif kind == "hidden":
                source = HiddenStateCache.build(reference_model, batches, copy_head=False)
                source.head = OutputHead.of(reference_model)
            elif kind == "log_probs":
                source = FrozenCache.build(reference_model, batches, top_k)
            else:
                raise ValueError("cache='expectation' needs the frozen and current heads to be one frozen head")
            return FrozenSide(source, kind, "reference model")
        if hasattr(model, "disable_adapter"):
            source = DisabledAdapter() if kind == "none" else _build(kind, model, batches, top_k, disable_adapter=True)
            return FrozenSide(source, kind, "disabled adapter")
        if kind in ("none", "expectation"):
            raise ValueError(
                f"cache={kind!r} needs a PEFT model (its disabled adapter is the frozen model) or, for 'none', "
                "reference_model; full fine-tuning changes the only copy, including its head"
            )
        if resume_step > 0:
            if saved is None or not Path(saved).is_file():
                raise FileNotFoundError(
                    f"resuming at step {resume_step}, but the frozen-model cache {saved} written at train start is "
                    "missing: the starting model cannot be recovered; pass reference_model="
                )
            source = (HiddenStateCache if kind == "hidden" else FrozenCache).load(saved)
        else:
            source = _build(kind, model, batches, top_k, disable_adapter=False)
            if saved is not None:
                source.save(saved)
        return FrozenSide(source, kind, "model at train start")
