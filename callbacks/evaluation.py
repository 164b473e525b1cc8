"""`LmEvalCallback`: lm-eval tasks on the model being trained, at evaluation steps, with answer churn.

The tasks run in-process through lm-eval's `HFLM` wrapped around the training model object (no copy, no
checkpoint round trip), with a per-task `limit`. lm-eval reseeds the global RNGs and leaves the model in eval
mode, so the callback saves every RNG state (Python, NumPy, torch CPU and accelerators) and the train/eval
mode first and restores them afterwards: training continues exactly as it would have without evaluation.

Scores are logged in the trainer's own record of that step (see `kinfolk.callbacks.step_log`) as
`lm_eval/<task>/<metric>` (`/<filter>` appended when the task has filters) plus `..._count` (sum of per-sample
scores, e.g. problems solved). With `churn=True` the frozen model's
answers are recorded once at train start (a PEFT model with its adapters switched off, or the model before
its first step) and every later run is compared with them: `churn/<task>/C|F|G|W` and their rates (see
`kinfolk.drift.churn`). Per-sample records are saved under `<output_dir>/lm_eval/` (`frozen/` and
`step-<N>/`, lm-eval's sample format) so churn between any two runs can be recomputed with `kinfolk churn`.

Distributed training: lm-eval runs on the main process over its full copy of the model (DDP, ZeRO-1/2);
sharded models (FSDP, ZeRO-3) are refused — evaluate their checkpoints with `kinfolk eval` instead.

    trainer.add_callback(LmEvalCallback(trainer, ["kinfolk_gsm8k"], limit=200, every_n_steps=100))
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kinfolk.atomic import atomic_file
from kinfolk.callbacks.schedule import MeasuredAtSteps
from kinfolk.callbacks.step_log import log_step_metrics
from kinfolk.drift.churn import churn_report, flat_metrics, outcomes, read_samples
from kinfolk.drift.log import append_row
from kinfolk.eval_tasks import task_dir
from kinfolk.eval_tasks.execution import ALLOW_ENV
from kinfolk.sharding import refuse_under_sharding

WHOLE_MODEL_ON_MAIN = "it needs the whole model on the main process; evaluate saved checkpoints with `kinfolk eval`"

ACCELERATORS = ("cuda", "xpu", "mps", "npu")


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restore Python, NumPy, torch CPU and every accelerator's RNG state on exit."""
    python_state, numpy_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    devices = {}
    for name in ACCELERATORS:
        module = getattr(torch, name, None)
        if module is not None and module.is_available() and hasattr(module, "get_rng_state_all"):
            devices[name] = module.get_rng_state_all()
        elif module is not None and module.is_available() and hasattr(module, "get_rng_state"):
            devices[name] = module.get_rng_state()
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        for name, state in devices.items():
            module = getattr(torch, name)
            (module.set_rng_state_all if isinstance(state, list) else module.set_rng_state)(state)


@contextlib.contextmanager
def _code_execution(allowed: bool) -> Iterator[None]:
    previous = os.environ.get(ALLOW_ENV)
    if allowed:
        os.environ[ALLOW_ENV] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ALLOW_ENV, None)
        else:
            os.environ[ALLOW_ENV] = previous


def metric_name(task: str, key: str) -> str:
    """lm-eval's "metric,filter" result key as a log name: `lm_eval/<task>/<metric>[/<filter>]`."""
    metric, _, filter_name = key.partition(",")
    return f"lm_eval/{task}/{metric}" + (f"/{filter_name}" if filter_name and filter_name != "none" else "")


def score_metrics(results: dict[str, Any], samples: dict[str, list[dict]]) -> dict[str, float]:
    """Flat scores from `simple_evaluate` output: every numeric metric, and per-sample sums as `_count`."""
    flat: dict[str, float] = {}
    for task, values in results["results"].items():
        for key, value in values.items():
            if "," in key and "_stderr" not in key and isinstance(value, (int, float)) and not isinstance(value, bool):
                flat[metric_name(task, key)] = float(value)
    for task, records in samples.items():
        for record in records:
            for metric in record.get("metrics", []):
                value = record.get(metric)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    name = metric_name(task, f"{metric},{record.get('filter', 'none')}") + "_count"
                    flat[name] = flat.get(name, 0.0) + float(value)
    return flat


def run_lm_eval(
    model: torch.nn.Module,
    tokenizer,
    tasks: Sequence[str],
    task_manager=None,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    batch_size: int = 8,
    seed: int = 1234,
    confirm_run_unsafe_code: bool = False,
    **simple_evaluate_kwargs,
) -> tuple[dict[str, Any], dict[str, list[dict]]]:
    """Evaluate a model object in-process; returns lm-eval's results and its per-sample records per task.

    RNG states and the model's train/eval mode are restored afterwards; kinfolk's tasks are always included.
    """
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    task_manager = task_manager or TaskManager(include_path=str(task_dir()))
    was_training = model.training
    try:
        with preserved_rng(), _code_execution(confirm_run_unsafe_code):
            lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
            output = simple_evaluate(
                model=lm,
                tasks=list(tasks),
                num_fewshot=num_fewshot,
                limit=limit,
                task_manager=task_manager,
                log_samples=True,
                random_seed=seed,
                numpy_random_seed=seed,
                torch_random_seed=seed,
                fewshot_random_seed=seed,
                confirm_run_unsafe_code=confirm_run_unsafe_code,
                **{"bootstrap_iters": 0, **simple_evaluate_kwargs},
            )
    finally:
        model.train(was_training)
    return output, output.get("samples", {})


def write_samples(directory: str | Path, samples: dict[str, list[dict]]) -> None:
    for task, records in samples.items():
        with atomic_file(Path(directory) / f"samples_{task}.jsonl") as handle:
            for record in records:
                handle.write(json.dumps(record, default=str, ensure_ascii=False) + "\n")


def read_sample_dir(directory: str | Path) -> dict[str, list[dict]]:
    return {
        path.stem.removeprefix("samples_"): read_samples(path)
        for path in sorted(Path(directory).glob("samples_*.jsonl"))
    }


def churn_metrics(frozen: dict[str, list[dict]], current: dict[str, list[dict]]) -> tuple[dict[str, float], dict]:
    """Churn of `current` against `frozen` for every task and filter both ran."""
    flat: dict[str, float] = {}
    reports: dict[str, Any] = {}
    for task in sorted(set(frozen) & set(current)):
        for filter_name in sorted({record.get("filter", "none") for record in current[task]}):
            report = churn_report(
                outcomes(frozen[task], filter_name=filter_name), outcomes(current[task], filter_name=filter_name)
            )
            prefix = f"churn/{task}" + (f"/{filter_name}" if filter_name != "none" else "")
            flat.update(flat_metrics(report, prefix))
            reports[prefix] = report
    return flat, reports


class LmEvalCallback(MeasuredAtSteps):
    """Run lm-eval tasks during training; see the module docstring.

    Args:
        trainer: the trainer it reports through (as TRL's callbacks take it).
        tasks: lm-eval task names; kinfolk's `eval_tasks/` are always on the include path.
        limit: examples per task (int) or fraction (float), as lm-eval's `limit`.
        every_n_steps: also run every N optimizer steps (None: at evaluations and at the end).
        churn: record the frozen model's answers at train start and log churn against them.
        include_path: extra task folders to index, besides kinfolk's.
        include_defaults: also index lm-eval's built-in tasks (False saves the indexing time when only
            kinfolk's and your own tasks run).
        confirm_run_unsafe_code: allow code-executing tasks (kinfolk's MBPP run in its sandbox).
        batch_size, num_fewshot, seed: passed to lm-eval (the same seed at every run).
        simple_evaluate_kwargs: anything else for `lm_eval.simple_evaluate` (e.g. `apply_chat_template`).
    """

    def __init__(
        self,
        trainer,
        tasks: Sequence[str],
        limit: int | float | None = None,
        every_n_steps: int | None = None,
        churn: bool = True,
        include_path: str | Sequence[str] | None = None,
        include_defaults: bool = True,
        confirm_run_unsafe_code: bool = False,
        batch_size: int = 8,
        num_fewshot: int | None = None,
        seed: int = 1234,
        **simple_evaluate_kwargs,
    ):
        if not tasks:
            raise ValueError("LmEvalCallback needs at least one task")
        refuse_under_sharding(trainer, "LmEvalCallback", WHOLE_MODEL_ON_MAIN, under_fsdp=True)
        super().__init__(every_n_steps)
        self.trainer = trainer
        self.tasks = list(tasks)
        self.limit = limit
        self.churn = churn
        extra = [include_path] if isinstance(include_path, str) else list(include_path or [])
        self.include_path = [str(task_dir()), *extra]
        self.include_defaults = include_defaults
        self.options = dict(
            limit=limit,
            num_fewshot=num_fewshot,
            batch_size=batch_size,
            seed=seed,
            confirm_run_unsafe_code=confirm_run_unsafe_code,
            **simple_evaluate_kwargs,
        )
        self.frozen_samples: dict[str, list[dict]] | None = None
        self._task_manager = None
        self.metrics: dict[str, float] = {}

    @property
    def folder(self) -> Path:
        return Path(self.trainer.args.output_dir) / "lm_eval"

    def _run(self, disable_adapter: bool = False) -> tuple[dict, dict]:
        from lm_eval.tasks import TaskManager

        if self._task_manager is None:
            self._task_manager = TaskManager(include_path=self.include_path, include_defaults=self.include_defaults)
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        tokenizer = self.trainer.processing_class
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's text tokenizer
        with model.disable_adapter() if disable_adapter else contextlib.nullcontext():
            return run_lm_eval(model, tokenizer, self.tasks, self._task_manager, **self.options)

    def _record_frozen(self, state) -> None:
        folder = self.folder / "frozen"
        if folder.is_dir() and any(folder.glob("samples_*.jsonl")):
            self.frozen_samples = read_sample_dir(folder)
            return
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        is_peft = hasattr(model, "disable_adapter")
        if state.global_step > 0 and not is_peft:
            raise FileNotFoundError(
                f"resuming at step {state.global_step} without the frozen model's answers in {folder}: "
                "churn needs them from the start of training (or pass churn=False)"
            )
        _, self.frozen_samples = self._run(disable_adapter=is_peft)
        write_samples(folder, self.frozen_samples)

    def evaluate(self, args, state, control) -> dict[str, float]:
        """Run the tasks now, log scores (and churn), save the samples and append to drift.jsonl; the metrics (on
        the main process; {} elsewhere and at a step already evaluated)."""
        return self.metrics if self.measure_once(args, state, control) else {}

    def measure_step(self, args, state, control) -> None:
        metrics: dict[str, float] = {}
        if args.process_index == 0:
            start = time.perf_counter()
            results, samples = self._run()
            metrics = score_metrics(results, samples)
            churn_details = {}
            if self.churn and self.frozen_samples is not None:
                churn_flat, churn_details = churn_metrics(self.frozen_samples, samples)
                metrics.update(churn_flat)
            write_samples(self.folder / f"step-{state.global_step}", samples)
            row = {"step": state.global_step, "epoch": state.epoch, **metrics}
            row["lm_eval_seconds"] = round(time.perf_counter() - start, 3)
            if churn_details:
                row["churn"] = churn_details
            if control.should_save:
                row["checkpoint"] = f"checkpoint-{state.global_step}"
            append_row(args.output_dir, row)
            log_step_metrics(self.trainer, control, metrics)
        self.metrics = metrics
        self.trainer.accelerator.wait_for_everyone()

    def on_train_begin(self, args, state, control, **kwargs):
        if self.churn and self.frozen_samples is None:
            if args.process_index == 0:
                self._record_frozen(state)
            self.trainer.accelerator.wait_for_everyone()

    def on_save(self, args, state, control, **kwargs):
        if args.process_index == 0:
            append_row(args.output_dir, {"step": state.global_step, "checkpoint": f"checkpoint-{state.global_step}"})
