"""How `kinfolk compare` trains one run: `kinfolk sft`'s trainer with the method, measured as it trains.

A run is `WeightedSFTTrainer` on the target's training split at one learning rate and seed, for `--max_steps`
steps, with the method's adapter or regulariser (`kinfolk.compare.methods.METHODS`; ATLAS's options and fit are `kinfolk
sft`'s, `AtlasArguments`), and two callbacks measuring every `--eval_steps` steps from step 0 into the run's
`drift.jsonl`: `RetainedKLCallback` (KL(frozen || current) on the retained KL split) and `TargetMetricCallback`
(the target score, higher is better: minus the validation NLL per token by default, a user's function with
`--metric`, or an lm-eval task's metric with `--lm_eval_task`).

`CompareRuns(args)` checks every input first (the model, the four splits, the metric, the lm-eval task, whether
full fine-tuning fits, finished runs trained under other settings) and refuses bad input before any model loads.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from math import prod
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from kinfolk.callbacks import RetainedKLCallback
from kinfolk.callbacks.retained_kl import FROZEN_CACHE_FILE
from kinfolk.callbacks.schedule import geometric_steps
from kinfolk.callbacks.target_metric import (
    TargetMetricCallback,
    lm_eval_metric,
    load_metric_function,
    metric_function,
    validation_nll,
)
from kinfolk.commands.sft_atlas_options import AtlasArguments
from kinfolk.compare.answers import ANSWERS_FILE, AnswersCallback, retained_prompts
from kinfolk.compare.grid import RunKey, check_settings, run_keys
from kinfolk.compare.measures import NLL, TARGET, TEST, VALIDATION, Curves, append_drift, read_curves, source_keys
from kinfolk.compare.measures import key as key_of
from kinfolk.compare.methods import METHODS
from kinfolk.compare.options import CompareArguments
from kinfolk.compare.plan import NEWER
from kinfolk.compare.resume import CheckpointAtMeasurements, ResumePoint, finished, resume_point
from kinfolk.data import load_splits, naming, select_split
from kinfolk.errors import InputError
from kinfolk.inputs import check_model
from kinfolk.tensors import TensorReader
from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

FULL_BYTES_PER_PARAMETER = 16  # fp32 weights, gradients and Adam's two moments


class _StepDone(TrainerCallback):
    def __init__(self, step_done):
        self.step_done = step_done

    def on_step_end(self, args, state, control, **kwargs):
        self.step_done()


class CompareRuns:
    """The comparison's inputs, checked, and how to train and read each of its runs (`train`, `load`)."""

    def __init__(self, args: CompareArguments):
        self.args = args
        self.keys = run_keys(args.methods, args.rate_grid(), args.seeds)
        self.user_metric = load_metric_function(args.metric) if args.metric else None
        self.settings = {method: self._settings(method) for method in args.methods}
        check_settings(self.keys, args.out, self.settings)
        check_model(args.model_name_or_path, "the --model_name_or_path", tokenizer=True)
        self.sources = args.retained_sources()
        with _no_progress_bars():  # before the log opens: datasets' bars would reach the terminal
            target_splits = load_splits(args.dataset_name)
            source_splits = {name: load_splits(path) for name, path in self.sources.items()}
        self.train_rows = select_split(target_splits, args.dataset_train_split, args.dataset_name)
        self.validation_rows = select_split(target_splits, args.dataset_validation_split, args.dataset_name)
        self.retained_rows = _together(
            {
                name: select_split(source_splits[name], args.retained_train_split, path)
                for name, path in self.sources.items()
            }
        )
        self.kl_rows = {
            (VALIDATION, name): select_split(source_splits[name], args.retained_kl_split, path)
            for name, path in self.sources.items()
        }
        if args.test_split is not None:
            self.test_rows = select_split(target_splits, args.test_split, args.dataset_name)
            self.kl_rows |= {
                (TEST, name): select_split(source_splits[name], args.test_split, path)
                for name, path in self.sources.items()
            }
        self.task_manager = _lm_eval_tasks(args.lm_eval_task) if args.lm_eval_task is not None else None
        if "full" in args.methods:
            _check_full_fits(args.model_name_or_path, args.use_cpu)
        self.tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)

    def _settings(self, method: str) -> dict:
        """Everything that shapes a run of `method` besides its rate and seed (its `run.json` fingerprint)."""
        args = self.args
        shared = {
            name: getattr(args, name)
            for name in (
                "model_name_or_path", "dataset_name", "dataset_train_split", "dataset_validation_split",
                "retained_dataset_name", "retained_kl_split", "max_steps", "eval_steps", "per_device_train_batch_size",
                "gradient_accumulation_steps", "max_length", "lr_scheduler_type", "metric", "lm_eval_task",
                "lm_eval_metric", "lm_eval_limit", "measure_batch_size", "dtype",
            )
        }  # fmt: skip
        sources = args.retained_dataset_name
        shared["retained_dataset_name"] = (
            sources[0] if len(sources) == 1 else sources
        )  # one source: fingerprinted as before
        if args.test_split is not None:
            shared["test_split"] = args.test_split
        for name in ("eval_points", "retained_nll"):  # fingerprinted where set: runs from before them keep theirs
            if getattr(args, name) != NEWER[name]:
                shared[name] = getattr(args, name)
        return {"method": method, **shared, **{name: getattr(args, name) for name in METHODS[method].settings}}

    @property
    def target(self) -> str:
        """What the target score is, for the report."""
        args = self.args
        split = f"{args.dataset_name} ({args.dataset_validation_split})"
        if args.lm_eval_task is not None:
            return f"lm-eval {args.lm_eval_task} {args.lm_eval_metric}"
        if args.metric is not None:
            return f"{args.metric} on {split}"
        return f"minus the NLL per token of {split}"

    def about(self) -> list[str]:
        """report.md's description of the set-up."""
        args = self.args
        return [
            f"Model `{args.model_name_or_path}`; target `{args.dataset_name}` (trained on `{args.dataset_train_split}`"
            f"); retained {', '.join(f'`{name}` (`{path}`)' for name, path in self.sources.items())} (KL measured on "
            f"`{args.retained_kl_split}`, regularisers and the ATLAS fit on `{args.retained_train_split}`)"
            + ("." if args.test_split is None else f"; every verdict reads the test split `{args.test_split}`."),
            f"Target score (higher is better): {self.target}. Drift: retained KL(frozen || current) per token"
            + ("." if len(self.sources) == 1 else ", the geometric mean over the retained sources."),
            f"{len(self.keys)} runs: methods {', '.join(args.methods)} x learning rates {self._rates()} x seeds "
            f"{', '.join(map(str, args.seeds))}; {args.max_steps} steps each, measured at step 0 and "
            + (f"every {args.eval_steps} steps." if args.eval_points is None else
               f"steps {', '.join(map(str, geometric_steps(args.max_steps, args.eval_points)))}."),
        ]  # fmt: skip

    def _rates(self) -> str:
        grid = self.args.rate_grid()
        if self.args.method_learning_rates is None:
            return ", ".join(f"{rate:g}" for rate in self.args.learning_rates)
        return "; ".join(f"{method} " + ", ".join(f"{rate:g}" for rate in rates) for method, rates in grid.items())

    @property
    def splits(self) -> list[str]:
        """The splits every checkpoint is measured on."""
        return [VALIDATION] + ([TEST] if self.args.test_split is not None else [])

    def load(self, key: RunKey, folder: Path) -> Curves:
        """A run's curves from its drift.jsonl (`kinfolk.compare.measures`)."""
        return read_curves(key.method, key.seed, folder, list(self.sources), self.args.test_split is not None)

    def train(self, key: RunKey, folder: Path, step_done) -> ResumePoint:
        """Train the run `key` into `folder` (its drift.jsonl), calling `step_done()` after every step; an interrupted
        run resumes from its last measured step (`kinfolk.compare.resume`). Returns where it started."""
        args = self.args
        start = resume_point(folder)
        dtype = "auto" if args.dtype == "auto" else getattr(torch, args.dtype)
        cpu = args.use_cpu or not torch.accelerator.is_available()
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, dtype=dtype)
        method = METHODS[key.method]
        atlas = AtlasArguments(
            use_atlas=True,
            atlas_layers=args.layers,
            atlas_target_modules=args.target_modules,
            atlas_r=args.rank,
            atlas_regions=args.atlas_regions,
            atlas_directions=args.atlas_directions,
            atlas_fit_max_length=args.max_length,
            atlas_seed=key.seed,
        )
        peft_config = method.peft_config(model, atlas.peft_config())  # at ATLAS's placement and rank
        regulariser = {method.regulariser: getattr(args, method.regulariser)} if method.regulariser else {}
        config = WeightedSFTConfig(
            output_dir=str(folder),
            learning_rate=key.learning_rate,
            seed=key.seed,
            max_steps=args.max_steps,
            per_device_train_batch_size=args.per_device_train_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            max_length=args.max_length,
            lr_scheduler_type=args.lr_scheduler_type,
            logging_steps=args.eval_steps,
            save_strategy="no",  # CheckpointAtMeasurements saves, at the measured steps
            save_total_limit=1,
            report_to="none",
            disable_tqdm=True,
            use_cpu=cpu,
            bf16=False if cpu else None,  # chosen here: the trainer's CPU note would hint --bf16, not compare's
            gradient_checkpointing=False,
            weight_column=None,
            **regulariser,
        )
        with naming(args.dataset_name):
            trainer = WeightedSFTTrainer(
                model=model,
                args=config,
                train_dataset=self.train_rows,
                processing_class=self.tokenizer,
                peft_config=peft_config,
                retained_dataset=self.retained_rows if regulariser else None,
            )
        if method.fits_atlas:
            rows = self.retained_rows
            if args.atlas_fit_rows is not None:
                rows = rows.select(range(min(args.atlas_fit_rows, len(rows))))
            atlas.fit(trainer.model, self.tokenizer, progress=False, retained=rows)
        at_steps = geometric_steps(args.max_steps, args.eval_points) if args.eval_points else None
        every = None if at_steps else args.eval_steps
        schedule = {"every_n_steps": every, "at_steps": at_steps}
        for split in self.splits:
            for source, name in source_keys(list(self.sources), split).items():
                verdicts_split = split == self.splits[-1]  # `--retained_nll` is logged on the split verdicts read
                trainer.add_callback(
                    RetainedKLCallback(
                        trainer,
                        self.kl_rows[split, source],
                        batch_size=args.measure_batch_size,
                        max_length=args.max_length,
                        metric_name=name,
                        measure_at_start=True,
                        nll_name=key_of(NLL, split, source) if args.retained_nll and verdicts_split else None,
                        **schedule,
                    )
                )
            rows = self.validation_rows if split == VALIDATION else self.test_rows
            trainer.add_callback(
                TargetMetricCallback(
                    trainer, self._measure(config, rows), metric_name=key_of(TARGET, split), **schedule
                )
            )
        if args.churn_prompts:  # answer churn beside the KL (kinfolk.compare.answers), on the first retained source
            kl_rows = self.kl_rows[VALIDATION, next(iter(self.sources))]
            prompts = retained_prompts(kl_rows, self.tokenizer, args.churn_prompts)
            trainer.add_callback(AnswersCallback(trainer, prompts, every, args.churn_tokens, folder / ANSWERS_FILE,
                                                 at_steps))  # fmt: skip
        trainer.add_callback(_StepDone(step_done))
        if args.run_checkpoints:
            trainer.add_callback(CheckpointAtMeasurements(every, at_steps, args.max_steps, folder, start.seconds))
        trainer.train(resume_from_checkpoint=start.checkpoint)
        append_drift(folder, list(self.sources), self.splits)
        finished(folder)
        del trainer, model
        for cache in folder.glob(FROZEN_CACHE_FILE.format(rank="*")):  # full fine-tuning's frozen side: done with
            cache.unlink()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return start

    def _measure(self, config: WeightedSFTConfig, rows):
        """The target metric on `rows` (the target's validation or test split)."""
        args = self.args
        if args.lm_eval_task is not None:
            return lm_eval_metric(
                args.lm_eval_task, args.lm_eval_metric, args.lm_eval_limit, args.measure_batch_size, self.task_manager
            )
        if self.user_metric is not None:
            return metric_function(self.user_metric, list(rows))
        return validation_nll(rows, self.tokenizer, config, args.max_length, args.measure_batch_size)


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    import datasets

    enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if enabled:
            datasets.enable_progress_bars()


def _together(rows_by_source: dict):
    """The sources' training rows as one dataset (their columns must agree: one SFT format)."""
    from datasets import concatenate_datasets

    columns = {name: sorted(rows.column_names) for name, rows in rows_by_source.items()}
    if len({tuple(names) for names in columns.values()}) > 1:
        raise InputError(
            f"the retained sources' training rows have different columns ({columns}); give them one format"
        )
    return concatenate_datasets(list(rows_by_source.values()))


def _lm_eval_tasks(task: str):
    """lm-eval's index of the tasks, built once for every run: kinfolk's alone when `task` is one of them (a second
    to build), else lm-eval's too; a task neither knows is refused."""
    from lm_eval.tasks import TaskManager

    from kinfolk.eval_tasks import task_dir

    for include_defaults in (False, True):
        manager = TaskManager(include_path=str(task_dir()), include_defaults=include_defaults)
        if task in manager.all_tasks:
            return manager
    raise InputError(f"--lm_eval_task {task}: no such lm-eval task (kinfolk's or lm-eval's)")


def _check_full_fits(model: str, use_cpu: bool) -> None:
    """Refuse full fine-tuning whose fp32 weights, gradients and Adam moments exceed the free device memory."""
    if not Path(model).is_dir():  # a Hub id: its size is not known before it loads
        return
    reader = TensorReader(model)
    needed = FULL_BYTES_PER_PARAMETER * sum(prod(reader.shape_and_dtype(name)[0]) for name in reader.names())
    if torch.cuda.is_available() and not use_cpu:
        free, where = torch.cuda.mem_get_info()[0], "on the GPU"
    else:
        free, where = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "in memory"
    if needed > free:
        raise InputError(
            f"--methods full: full fine-tuning of {model} needs about {needed / 2**30:.1f} GiB (fp32 weights, "
            f"gradients and Adam's two moments) and {free / 2**30:.1f} GiB is free {where}; leave it out"
        )
