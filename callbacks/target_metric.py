"""`TargetMetricCallback`: the score training aims at, measured on held-out data at the steps the retained KL is.

What drift is matched against: a run's target score (higher is better) at step 0 (the untouched model), every N
optimiser steps, at evaluations and at the end, logged in the trainer's record of the step (`metric_name`,
default `target`) and appended to `drift.jsonl` beside the retained KL, so `kinfolk drift` and `kinfolk compare`
join the two by step. The measure is a function of the model and its tokenizer; three are built here:

- `validation_nll(rows, tokenizer)`: minus the mean negative log-likelihood per trained token of held-out SFT rows
  (the tokens the SFT trainer would train on, tokenised exactly as it does), pooled over tokens;
- `metric_function(function, rows)`: a user's `function(model, tokenizer, rows) -> float`;
- `lm_eval_metric(task, metric)`: one lm-eval task's metric, run in-process (`kinfolk.callbacks.evaluation`).

The model is measured in eval mode without gradients, and every RNG state is restored afterwards, so measuring
changes nothing about training. Each process measures (a sharded model needs them all); the main one writes.
A measure with fixed teacher-forced batches (`validation_nll`'s `.batches`) runs from the first changed layer where
that is exact (`measure_from_layer=True`, as `RetainedKLCallback` does; `kinfolk.prefix_cache`).

    trainer.add_callback(TargetMetricCallback(trainer, validation_nll(validation, tokenizer), every_n_steps=50))
"""

from __future__ import annotations

import contextlib
import importlib
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kinfolk.batches import retained_batches
from kinfolk.callbacks.evaluation import preserved_rng, run_lm_eval, score_metrics
from kinfolk.callbacks.schedule import MeasuredAtSteps
from kinfolk.callbacks.step_log import log_step_metrics
from kinfolk.divergence import OutputHead, label_log_probs_from_hidden, last_hidden_states
from kinfolk.divergence.sources import scored_positions
from kinfolk.drift.log import append_row
from kinfolk.errors import InputError
from kinfolk.prefix_cache import MeasuredFromLayer
from kinfolk.sharding import gathered_for_reading, unsharded_root
from kinfolk.tokens import IGNORE_INDEX

Measure = Callable[[torch.nn.Module, Any], float]  # (model, tokenizer) -> score, higher is better
PREFIX_DIRECTORY = "{name}_prefix{rank}"  # where large kept layer inputs go, freed at the end of training


class TargetMetricCallback(MeasuredAtSteps):
    """Measure `measure(model, tokenizer)` during training; see the module docstring.

    Args:
        trainer: the trainer it reports through (as TRL's callbacks take it).
        measure: the score of the model now, higher is better.
        every_n_steps: also measure every N optimiser steps (None: at evaluations, the start and the end).
        metric_name: the logged name.
        measure_at_start: measure the untouched model before the first step.
        measure_from_layer: a measure with `.batches` runs from the first changed layer where that is exact;
            False: full forwards.
        at_steps: also measure at these optimiser steps (`kinfolk.callbacks.schedule.geometric_steps`).
    """

    def __init__(
        self,
        trainer,
        measure: Measure,
        every_n_steps: int | None = None,
        metric_name: str = "target",
        measure_at_start: bool = True,
        measure_from_layer: bool = True,
        at_steps: Collection[int] | None = None,
    ):
        super().__init__(every_n_steps, measure_at_start, at_steps)
        self.trainer = trainer
        self.measure = measure
        self.metric_name = metric_name
        rank = trainer.args.process_index
        name = PREFIX_DIRECTORY.format(name=metric_name.replace("/", "_"), rank=f".rank{rank}" if rank else "")
        self.prefix = MeasuredFromLayer(measure_from_layer, Path(trainer.args.output_dir) / name)

    def score(self) -> float:
        """The target score of the model now (eval mode, no gradients, RNG states and train mode restored)."""
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        tokenizer = self.trainer.processing_class
        was_training = model.training
        model.eval()
        batches = getattr(self.measure, "batches", None)
        from_layer = contextlib.nullcontext() if batches is None else self.prefix.active(model, batches)
        try:
            # under FSDP2 the root's own weights (embeddings, norm, head) are gathered: measures run the backbone
            # and read the head outside the root's forward (`kinfolk.sharding`)
            with unsharded_root(model), preserved_rng(), torch.no_grad(), from_layer:
                return float(self.measure(model, getattr(tokenizer, "tokenizer", tokenizer)))
        finally:
            model.train(was_training)

    def measure_step(self, args, state, control) -> None:
        start = time.perf_counter()
        value = self.score()
        if not math.isfinite(value):
            raise InputError(f"the target metric {self.metric_name!r} is {value} at step {state.global_step}")
        log_step_metrics(self.trainer, control, {self.metric_name: value})
        if args.process_index == 0:
            seconds = round(time.perf_counter() - start, 4)
            row = {"step": state.global_step, "epoch": state.epoch, self.metric_name: value}
            append_row(args.output_dir, {**row, f"{self.metric_name}_seconds": seconds})

    def on_train_end(self, args, state, control, **kwargs):
        super().on_train_end(args, state, control, **kwargs)
        self.prefix.close()  # a later `score()` keeps them again


@dataclass(frozen=True, eq=False)
class ValidationNLL:
    """Minus the mean NLL per trained token over fixed batches (`batches`: what a prefix cache keys on)."""

    batches: list[dict[str, torch.Tensor]]

    def __call__(self, model: torch.nn.Module, _tokenizer=None) -> float:
        head = OutputHead.of(model)
        total = tokens = 0.0
        with torch.no_grad(), gathered_for_reading(head.weight, head.bias):
            for batch in self.batches:
                batch = {name: tensor.to(head.weight.device) for name, tensor in batch.items()}
                # the head on the scored positions only (a completion is often a small part of a row)
                scored = batch["labels"][:, 1:] != IGNORE_INDEX
                hidden = last_hidden_states(model, batch["input_ids"], batch["attention_mask"])
                hidden = scored_positions(hidden, scored.to(hidden.device)).to(head.weight.device)
                labels = batch["labels"][:, 1:][scored]
                total += float(label_log_probs_from_hidden(hidden, labels, head).sum())
                tokens += float(scored.sum())
        return total / max(tokens, 1.0)


def validation_nll(rows, tokenizer, sft_args=None, max_length: int | None = 1024, batch_size: int = 8) -> Measure:
    """Minus the mean NLL per trained token of `rows` (SFT rows, tokenised as the trainer with `sft_args` would)."""
    return ValidationNLL(retained_batches(rows, tokenizer, "response", max_length, batch_size, sft_args, "validation"))


def load_metric_function(spec: str) -> Callable:
    """`module:function` imported: the user's target metric."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise InputError(f"--metric takes module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise InputError(f"--metric {spec}: cannot import {module_name} ({error})") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise InputError(f"--metric {spec}: {module_name} has no function {name!r}")
    return function


def metric_function(function: Callable, rows: Sequence[dict]) -> Measure:
    """A user's `function(model, tokenizer, rows) -> float` (higher is better) on fixed `rows`."""
    return lambda model, tokenizer: function(model, tokenizer, rows)


def lm_eval_metric(
    task: str, metric: str, limit: int | float | None = None, batch_size: int = 8, task_manager=None
) -> Measure:
    """lm-eval's `metric` of `task` (its first filter when the task has several), on `limit` examples;
    `task_manager` (lm-eval's index of tasks, seconds to build) defaults to kinfolk's tasks and lm-eval's."""
    name = f"lm_eval/{task}/{metric}"

    def measure(model: torch.nn.Module, tokenizer) -> float:
        results, samples = run_lm_eval(model, tokenizer, [task], task_manager, limit=limit, batch_size=batch_size)
        scores = score_metrics(results, samples)
        found = [key for key in scores if key == name or (key.startswith(f"{name}/") and not key.endswith("_count"))]
        if not found:
            raise InputError(f"lm-eval task {task} has no metric {metric!r}; it reports {sorted(scores)}")
        return scores[found[0]]

    return measure
