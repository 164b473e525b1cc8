"""`RetainedKLCallback`: how far training has moved the model's next-token distribution on retained data.

The metric is the mean next-token KL(frozen ‖ current) over fixed, teacher-forced retained contexts (response
tokens, or every token), pooled over tokens. It is measured at each evaluation and/or every N steps, logged
in the trainer's own record of that step (`retained_kl` reaches TensorBoard, W&B and `trainer.state.log_history`
beside loss, grad_norm and learning rate; see `kinfolk.callbacks.step_log`) and appended to
`drift.jsonl` in the output directory together with the step (and, when a checkpoint is saved, its name).

Where the frozen distribution comes from:
- a PEFT model: its own adapters switched off (no second copy of the weights);
- full fine-tuning: the model as it is when training starts (saved to the output directory, so a resumed run
  measures against the same frozen model), or `reference_model`.
The frozen side is computed once at train start (`kinfolk.divergence` caches), so a measurement costs one
forward pass of the current model plus a chunked head pass, never full logits. `cache="auto"` (default) picks
`"expectation"` where it is exact (forward KL, a PEFT model whose head is frozen and not soft-capped: one head
projection per measurement) and `"hidden"` otherwise (frozen last hidden states; two head projections).
`"log_probs"` stores frozen log-probs (exact, or top-k with an error bound via `cache_top_k`); `"none"`
recomputes the frozen side at every measurement (a second forward pass).

Measuring from the first changed layer (`measure_from_layer=True`, the default): where every trainable parameter
and adapter lies in decoder layer L or above (ATLAS's placement, LoRA on one layer), the hidden states entering
layer L on this process's retained batches are computed once (`kinfolk.prefix_cache`), and each measurement runs
layers L.. and the head only; exact, and not used (read from the model) when anything below L can change.

Under FSDP2 and DeepSpeed ZeRO-3 the head read outside the model's forward is gathered whole for each measurement
(`kinfolk.sharding`); a test trains under ZeRO-3 on two CPU processes and recomputes the logged KL from the saved
weights.

    trainer = SFTTrainer(model=peft_model, args=SFTConfig(output_dir="out", eval_strategy="steps"), ...)
    trainer.add_callback(RetainedKLCallback(trainer, retained_dataset, every_n_steps=50))
    trainer.train()
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection
from pathlib import Path

import torch
from datasets import Dataset

from kinfolk.batches import retained_batches
from kinfolk.callbacks.schedule import MeasuredAtSteps
from kinfolk.callbacks.step_log import log_step_metrics
from kinfolk.divergence import (
    CACHES,
    DIVERGENCES,
    FrozenCache,
    OutputHead,
    frozen_source,
    label_log_probs_from_hidden,
    token_divergence,
)
from kinfolk.drift.log import append_row
from kinfolk.prefix_cache import MeasuredFromLayer
from kinfolk.sharding import unsharded_root

FROZEN_CACHE_FILE = "retained_kl_frozen{rank}.safetensors"
PREFIX_DIRECTORY = "retained_kl_prefix{rank}"  # where large kept layer inputs go, freed at the end of training


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {name: tensor.to(device) for name, tensor in batch.items()}


class RetainedKLCallback(MeasuredAtSteps):
    """Measure retained KL during training; see the module docstring for the frozen-side options.

    Args:
        trainer: the `transformers.Trainer` (or TRL trainer) it reports through, as TRL's own callbacks take it.
        retained_dataset: retained contexts in any SFT format, or pre-tokenised (`input_ids`, optional `labels`).
        processing_class: tokenizer for an untokenised dataset (default: the trainer's).
        positions: "response" (the tokens the SFT trainer would train on) or "all".
        every_n_steps: also measure every N optimizer steps (None: only at evaluations and at the end).
        reference_model: a frozen model to compare with instead of the disabled adapter / starting model.
        cache: "auto" (default), "expectation", "hidden", "log_probs" or "none" (see the module docstring).
        cache_top_k: with cache="log_probs", keep the k most likely tokens (None: the whole vocabulary).
        divergence: "forward_kl" (KL(frozen‖current), the default), "reverse_kl" or "jsd" (with `beta`).
        batch_size, max_length: measurement batches (max_length default: the trainer's, else 1024).
        metric_name: the logged name (default "retained_kl").
        measure_at_start: also measure before the first step (0 for an identity-initialised adapter).
        measure_from_layer: run only the layers from the first changed one where that is exact (see above);
            False: full forwards.
        at_steps: also measure at these optimiser steps (`kinfolk.callbacks.schedule.geometric_steps`).
        nll_name: also log the current model's NLL per token on the same positions under this name (PEFT's
            forgetting figure), from the same forward: one more head projection.
    """

    def __init__(
        self,
        trainer,
        retained_dataset: Dataset,
        processing_class=None,
        positions: str = "response",
        every_n_steps: int | None = None,
        reference_model: torch.nn.Module | None = None,
        cache: str = "auto",
        cache_top_k: int | None = None,
        divergence: str = "forward_kl",
        beta: float = 0.5,
        batch_size: int = 8,
        max_length: int | None = None,
        metric_name: str = "retained_kl",
        measure_at_start: bool = False,
        measure_from_layer: bool = True,
        at_steps: Collection[int] | None = None,
        nll_name: str | None = None,
    ):
        if cache not in CACHES:
            raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
        if divergence not in DIVERGENCES:
            raise ValueError(f"divergence must be one of {DIVERGENCES}, got {divergence!r}")
        super().__init__(every_n_steps, measure_at_start, at_steps)
        self.trainer = trainer
        self.positions = positions
        self.reference_model = reference_model
        self.cache = cache
        self.cache_top_k = cache_top_k
        self.divergence = divergence
        self.beta = beta
        self.metric_name = metric_name
        self.nll_name = nll_name
        tokenizer = processing_class or getattr(trainer, "processing_class", None)
        max_length = max_length or getattr(trainer.args, "max_length", None) or 1024
        sft_args = trainer.args if hasattr(trainer.args, "completion_only_loss") else None
        self.batches = retained_batches(retained_dataset, tokenizer, positions, max_length, batch_size, sft_args)
        self.frozen = None
        self.frozen_description = ""
        self.cache_used = cache
        rank = trainer.args.process_index
        directory = Path(trainer.args.output_dir) / PREFIX_DIRECTORY.format(rank=f".rank{rank}" if rank else "")
        self.prefix = MeasuredFromLayer(measure_from_layer, directory)

    # -- set-up -----------------------------------------------------------------------------------------------
    def _model(self) -> torch.nn.Module:
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def _my_batches(self) -> list[tuple[dict[str, torch.Tensor], float]]:
        """This process's share, padded with weight-0 repeats so every process runs the same number of forwards
        (ZeRO-3 and FSDP gather parameters collectively)."""
        rank, world = self.trainer.args.process_index, self.trainer.args.world_size
        share = [(batch, 1.0) for batch in self.batches[rank::world]]
        needed = math.ceil(len(self.batches) / world)
        return share + [(self.batches[0], 0.0)] * (needed - len(share))

    def _cache_path(self) -> Path:
        rank = self.trainer.args.process_index
        return Path(self.trainer.args.output_dir) / FROZEN_CACHE_FILE.format(rank=f".rank{rank}" if rank else "")

    def _build_frozen(self, state) -> None:
        model = self._model()
        device = OutputHead.of(model).weight.device
        # the prefix first: a frozen side built through the model then also starts at the first changed layer
        with self.prefix.active(model, [batch for batch, _ in self._my_batches()]):
            frozen = frozen_source(
                model,
                (_to(batch, device) for batch, _ in self._my_batches()),
                self.cache,
                reference_model=self.reference_model,
                divergence=self.divergence,
                top_k=self.cache_top_k,
                saved=self._cache_path(),
                resume_step=state.global_step,
            )
        self.frozen, self.cache_used, self.frozen_description = frozen.source, frozen.cache, frozen.description

    # -- measurement ------------------------------------------------------------------------------------------
    def measure(self) -> dict[str, float]:
        """Retained KL of the model now: pooled token mean, per-context mean, token and context counts.

        Runs in the weights' own dtype, outside the trainer's mixed-precision autocast: the frozen side is exact,
        and bf16 matmul noise in the current side would otherwise swamp KLs of order 1e-3. Under FSDP2 the root's
        own parameters are gathered meanwhile (`kinfolk.sharding`).
        """
        with unsharded_root(self._model()):
            return self._measure()

    def _measure(self) -> dict[str, float]:
        if self.frozen is None:  # `trainer.evaluate()` before `train()`: the model is still the frozen one
            self._build_frozen(self.trainer.state)
        model = self._model()
        device = OutputHead.of(model).weight.device
        was_training = model.training
        model.eval()
        # [divergence sum, tokens, sum of per-context means, contexts, upper-bound sum, NLL sum]
        totals = torch.zeros(6, dtype=torch.float64, device=device)
        head = OutputHead.of(model)
        my_batches = self._my_batches()
        try:
            with torch.no_grad(), self.prefix.active(model, [batch for batch, _ in my_batches]):
                for batch, weight in my_batches:
                    batch = _to(batch, device)
                    result = token_divergence(
                        model,
                        batch["input_ids"],
                        batch["attention_mask"],
                        batch["labels"],
                        self.frozen,
                        kind=self.divergence,
                        beta=self.beta,
                    )
                    row_sums, row_counts = result.values.sum(-1).double(), result.mask.sum(-1).double()
                    scored = row_counts > 0
                    bound = 0.0 if result.upper_bound is None else result.upper_bound.double().sum()
                    nll = 0.0
                    if self.nll_name is not None:
                        labels = batch["labels"][:, 1:][result.mask].to(head.weight.device)
                        nll = -label_log_probs_from_hidden(result.current_hidden, labels, head).sum()
                    totals += weight * torch.stack(
                        [
                            row_sums.sum(),
                            row_counts.sum(),
                            (row_sums[scored] / row_counts[scored]).sum(),
                            scored.sum().double(),
                            torch.as_tensor(bound, dtype=torch.float64, device=device),
                            torch.as_tensor(nll, dtype=torch.float64, device=device),
                        ]
                    )
        finally:
            model.train(was_training)
        if self.trainer.args.world_size > 1:
            totals = self.trainer.accelerator.reduce(totals, reduction="sum")
        total, tokens, context_sum, contexts, bound, nll = totals.tolist()
        measured = {
            self.metric_name: total / max(tokens, 1.0),
            f"{self.metric_name}_context_mean": context_sum / max(contexts, 1.0),
            f"{self.metric_name}_tokens": int(tokens),
            f"{self.metric_name}_contexts": int(contexts),
        }
        if isinstance(self.frozen, FrozenCache) and self.frozen.top_k is not None:
            measured[f"{self.metric_name}_upper"] = (total + bound) / max(tokens, 1.0)
        if self.nll_name is not None:
            measured[self.nll_name] = nll / max(tokens, 1.0)
        return measured

    def measure_step(self, args, state, control) -> None:
        start = time.perf_counter()
        measured = self.measure()
        seconds = time.perf_counter() - start
        logged = {name: value for name, value in measured.items() if not name.endswith(("_tokens", "_contexts"))}
        log_step_metrics(self.trainer, control, logged)
        if args.process_index == 0:
            row = {"step": state.global_step, "epoch": state.epoch, **measured}
            row.update(
                divergence=self.divergence,
                positions=self.positions,
                frozen=self.frozen_description,
                cache=self.cache_used,
                from_layer=self.prefix.layer,
                seconds=round(seconds, 4),
            )
            if control.should_save:
                row["checkpoint"] = f"checkpoint-{state.global_step}"
            append_row(args.output_dir, row)

    # -- trainer events ---------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        if self.frozen is None:
            with unsharded_root(self._model()):
                self._build_frozen(state)
        super().on_train_begin(args, state, control, **kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        super().on_train_end(args, state, control, **kwargs)
        self.prefix.close()  # a later `measure()` keeps them again

    def on_save(self, args, state, control, **kwargs):
        if args.process_index == 0:
            append_row(args.output_dir, {"step": state.global_step, "checkpoint": f"checkpoint-{state.global_step}"})
