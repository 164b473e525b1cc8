"""`CompareArguments`: the options of `kinfolk compare`, as `TrlParser`/YAML fields (`--config compare.yaml`).

Checked as parsed (a value out of range is a one-line usage error, exit 2); what needs the files (splits, the
model, the metric's module) is checked by `kinfolk.compare.runs` before any model loads.

>>> args = CompareArguments(model_name_or_path="m", dataset_name="d", retained_dataset_name="r", out="o",
...                         methods=["lora", "lora_replay"], learning_rates=[1e-4], seeds=[0])
>>> args.baseline, args.levels
('lora', [0.25, 0.5, 0.75])
>>> CompareArguments(model_name_or_path="m", dataset_name="d", retained_dataset_name="r", out="o",
...                  methods=["lora", "dora"])
Traceback (most recent call last):
...
ValueError: --methods: unknown method 'dora'; choose from lora, atlas, norm_matched, lora_output_kl, lora_replay, osf, full
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kinfolk.compare.methods import METHODS

DTYPES = ("float32", "bfloat16", "float16", "auto")


@dataclass
class CompareArguments:
    model_name_or_path: str = field(metadata={"help": "The model every run starts from (a local model directory)."})
    dataset_name: str = field(
        metadata={
            "help": "Target data: SFT rows (prompt/completion, messages or text) in a data folder, a `save_to_disk` "
            "folder or a Hub dataset, with a training and a validation split."
        }
    )
    retained_dataset_name: list[str] = field(
        metadata={
            "help": "Retained data (the same formats) with a training split (replay, Output-KL, the ATLAS fit) and a "
            "split the retained KL is measured on; several sources as several values (a YAML list), each PATH or "
            "NAME=PATH (the name defaults to the folder's): the KL is measured per source, and the drift is their "
            "geometric mean."
        }
    )
    out: str = field(
        metadata={
            "help": "Folder of the comparison: runs/<method>/lr-<rate>/seed-<seed>/ (drift.jsonl, run.json), report/ "
            "and run.log. Rerunning the same command resumes: finished runs are skipped."
        }
    )
    methods: list[str] = field(
        default_factory=lambda: ["lora", "atlas"],
        metadata={
            "help": f"Methods to compare, among: {'; '.join(f'{m}: {method.help}' for m, method in METHODS.items())}."
        },
    )
    baseline: str = field(default="lora", metadata={"help": "The method every other one is judged against."})
    learning_rates: list[float] = field(
        default_factory=lambda: [1e-4, 3e-4, 1e-3],
        metadata={"help": "Learning rates tried for every method; each method's own is chosen on validation."},
    )
    method_learning_rates: list[str] | None = field(
        default=None,
        metadata={
            "help": "A method's own learning-rate grid instead of --learning_rates, as METHOD=RATE[,RATE...] (one "
            "value per method; ATLAS's filters damp its update, so it often learns at larger rates than LoRA)."
        },
    )
    seeds: list[int] = field(
        default_factory=lambda: [0, 1, 2, 3, 4],
        metadata={"help": "Seeds of every (method, rate); a verdict needs 5 for an interval."},
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Split of --dataset_name trained on."})
    dataset_validation_split: str = field(
        default="validation", metadata={"help": "Split of --dataset_name the target metric is measured on."}
    )
    test_split: str | None = field(
        default=None,
        metadata={
            "help": "Split of --dataset_name and of every retained source that only the verdicts read (every choice "
            "reads the validation splits); needed by --plan."
        },
    )
    plan: bool = field(
        default=False,
        metadata={
            "help": "Confirmatory mode: write OUT/plan.json (every setting, the primaries, its hash) before any run, "
            "refuse runs under a changed plan, and correct the primaries' verdicts by Holm (needs --test_split)."
        },
    )
    retained_train_split: str = field(
        default="train", metadata={"help": "Split of --retained_dataset_name that replay, Output-KL and ATLAS use."}
    )
    retained_kl_split: str = field(
        default="validation",
        metadata={
            "help": "Split of --retained_dataset_name the retained KL is measured on (held out from the regularisers: "
            "Output-KL minimises the KL on the rows it trains on)."
        },
    )
    max_steps: int = field(default=200, metadata={"help": "Optimiser steps of every run."})
    eval_steps: int = field(
        default=20, metadata={"help": "Measure the target and the retained KL every N steps (and at 0 and the end)."}
    )
    eval_points: int | None = field(
        default=None,
        metadata={
            "help": "Measure at this many steps spaced geometrically from step 1 to --max_steps (and at 0) instead of "
            "every --eval_steps: dense where the target rises fast, so each run's curve is read between close points."
        },
    )
    retained_nll: bool = field(
        default=False,
        metadata={
            "help": "Also log each retained source's NLL per token on the split the verdicts read, at every "
            "measurement: PEFT's forgetting figure (NLL after minus before), reported beside the KL."
        },
    )
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Training rows per step."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-batches per optimiser step."})
    max_length: int = field(default=1024, metadata={"help": "Rows are cut to this many tokens (training, measuring)."})
    lr_scheduler_type: str = field(default="linear", metadata={"help": "transformers' learning-rate schedule."})
    rank: int = field(default=16, metadata={"help": "Rank of the LoRA and ATLAS adapters."})
    target_modules: list[str] | None = field(
        default=None, metadata={"help": "Modules the adapters adapt; default: ATLAS's (attention output projection)."}
    )
    layers: list[int] | None = field(
        default=None,
        metadata={"help": "Decoder layers the adapters adapt; default: ATLAS's (one, at 0.47 of the depth)."},
    )
    atlas_regions: int = field(default=16, metadata={"help": "ATLAS: atlas regions K (1 = global PCA)."})
    atlas_directions: int = field(default=8, metadata={"help": "ATLAS: PCA directions per region."})
    atlas_fit_rows: int | None = field(
        default=None, metadata={"help": "ATLAS: fit on the first N retained training rows (default: all)."}
    )
    output_kl_coef: float = field(default=1.0, metadata={"help": "lora_output_kl: λ of the Output-KL term."})
    replay_ratio: float = field(default=0.25, metadata={"help": "lora_replay: fraction of training rows replayed."})
    metric: str | None = field(
        default=None,
        metadata={
            "help": "Target metric instead of the validation NLL: module:function, called as function(model, "
            "tokenizer, rows) with the validation rows (a list of dicts); returns a float, higher is better."
        },
    )
    lm_eval_task: str | None = field(
        default=None, metadata={"help": "Target metric instead of the validation NLL: this lm-eval task's score."}
    )
    lm_eval_metric: str = field(default="acc", metadata={"help": "The --lm_eval_task metric used as the target."})
    lm_eval_limit: int | None = field(default=None, metadata={"help": "Examples of --lm_eval_task per measurement."})
    selection_fraction: float = field(
        default=0.5,
        metadata={
            "help": "Rates are chosen at the level start + fraction x (best - start) of the baseline's best gain."
        },
    )
    levels: list[float] = field(
        default_factory=lambda: [0.25, 0.5, 0.75],
        metadata={"help": "Verdict levels, as fractions of the baseline's gain at its chosen rate."},
    )
    measure_batch_size: int = field(default=8, metadata={"help": "Rows per forward pass when measuring."})
    churn_prompts: int = field(
        default=64,
        metadata={
            "help": "Retained prompts (the first rows of --retained_kl_split) whose greedy answers each run keeps at "
            "every measurement, for the answer churn at the verdict levels; 0: none."
        },
    )
    churn_tokens: int = field(default=16, metadata={"help": "New tokens of each greedy answer (--churn_prompts)."})
    dtype: str = field(
        default="float32",
        metadata={"help": "Weights' dtype (float32 keeps KLs of 1e-4 above rounding noise).", "choices": DTYPES},
    )
    run_checkpoints: bool = field(
        default=True,
        metadata={
            "help": "Save a checkpoint at each measured step of a run (the last one kept, removed once the run is "
            "done), so a stopped comparison resumes a run from its last measurement, not its first step; "
            "--no_run_checkpoints where saving the weights and optimiser that often costs too much (full fine-tuning "
            "of a large model)."
        },
    )
    use_cpu: bool = field(default=False, metadata={"help": "Train on the CPU even where an accelerator is found."})
    threads: int | None = field(default=None, metadata={"help": "torch CPU threads."})
    verbose: bool = field(default=False, metadata={"help": "Show the libraries' output (else OUT/run.log has it)."})

    def __post_init__(self) -> None:
        if isinstance(self.retained_dataset_name, str):  # one source, as a keyword or a YAML scalar
            self.retained_dataset_name = [self.retained_dataset_name]
        names = [name for name, _ in self._named_sources()]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"--retained_dataset_name needs at least one source and distinct names, got {names} "
                             "(name two sources of one folder name NAME=PATH)")  # fmt: skip
        if self.plan and self.test_split is None:
            raise ValueError("--plan needs --test_split: the verdicts of a planned comparison read test splits only")
        if self.test_split is not None and self.lm_eval_task is not None:
            raise ValueError("--test_split and --lm_eval_task: an lm-eval task has no test split of kinfolk's")
        if self.test_split in (self.dataset_validation_split, self.retained_kl_split, self.dataset_train_split):
            raise ValueError(f"--test_split {self.test_split} is also a training or validation split")
        unknown = [method for method in self.methods if method not in METHODS]
        if unknown:
            raise ValueError(f"--methods: unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
        for name in ("methods", "learning_rates", "seeds", "levels"):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise ValueError(f"--{name} needs at least one value and no repeats, got {values}")
        if self.baseline not in self.methods:
            raise ValueError(f"--baseline {self.baseline} is not among --methods {' '.join(self.methods)}")
        if len(self.methods) < 2:
            raise ValueError(f"--methods needs the baseline and at least one other method, got {self.methods}")
        if not all(rate > 0 for rate in self.learning_rates):
            raise ValueError(f"--learning_rates must be positive, got {self.learning_rates}")
        own = self._own_rates()
        if not set(own) <= set(self.methods) or not all(r > 0 for rates in own.values() for r in rates):
            raise ValueError(f"--method_learning_rates: each value is METHOD=RATE[,RATE...], a method of --methods "
                             f"with positive rates, got {self.method_learning_rates}")  # fmt: skip
        if not all(0 < fraction <= 1 for fraction in (*self.levels, self.selection_fraction)):
            raise ValueError(f"--levels and --selection_fraction are fractions in (0, 1], got {self.levels} and "
                             f"{self.selection_fraction}")  # fmt: skip
        counts = ("per_device_train_batch_size", "gradient_accumulation_steps", "max_length", "rank", "atlas_regions",
                  "atlas_directions", "measure_batch_size", "atlas_fit_rows", "lm_eval_limit", "threads",
                  "churn_tokens", "eval_points")  # fmt: skip
        for name in counts:
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.churn_prompts < 0:
            raise ValueError(f"--churn_prompts must be 0 (none) or more, got {self.churn_prompts}")
        if self.max_steps < 1 or (self.eval_points is None and not 1 <= self.eval_steps <= self.max_steps):
            raise ValueError(f"need 1 <= --eval_steps <= --max_steps, got {self.eval_steps} and {self.max_steps}")
        if self.metric is not None and self.lm_eval_task is not None:
            raise ValueError("--metric and --lm_eval_task each set the target metric: give one")
        regularisers = {METHODS[method].regulariser: method for method in self.methods}
        if "replay_ratio" in regularisers and not 0 < self.replay_ratio < 1:
            raise ValueError(f"--replay_ratio must lie in (0, 1) for {regularisers['replay_ratio']}, got "
                             f"{self.replay_ratio}")  # fmt: skip
        if "output_kl_coef" in regularisers and not self.output_kl_coef > 0:
            raise ValueError(f"--output_kl_coef must be positive for {regularisers['output_kl_coef']}, got "
                             f"{self.output_kl_coef}")  # fmt: skip

    def rate_grid(self) -> dict[str, list[float]]:
        """Each method's learning rates: its own (`--method_learning_rates`), else `--learning_rates`.

        >>> CompareArguments(model_name_or_path="m", dataset_name="d", retained_dataset_name="r", out="o",
        ...                  learning_rates=[1e-3], method_learning_rates=["atlas=0.01,0.03"]).rate_grid()
        {'lora': [0.001], 'atlas': [0.01, 0.03]}
        """
        own = self._own_rates()
        return {method: own.get(method, list(self.learning_rates)) for method in self.methods}

    def _own_rates(self) -> dict[str, list[float]]:
        own = {}
        for value in self.method_learning_rates or []:
            method, _, rates = value.partition("=")
            try:
                own[method] = [float(rate) for rate in rates.split(",")]
            except ValueError:
                raise ValueError(f"--method_learning_rates: {value!r} is not METHOD=RATE[,RATE...]") from None
            if len(set(own[method])) != len(own[method]):
                raise ValueError(f"--method_learning_rates: {value!r} repeats a rate")
        return own

    def retained_sources(self) -> dict[str, str]:
        """Each retained source's name and data path (`NAME=PATH`, or the path's last part as its name).

        >>> CompareArguments(model_name_or_path="m", dataset_name="d", out="o",
        ...                  retained_dataset_name=["prose/", "code=data/code"]).retained_sources()
        {'prose': 'prose/', 'code': 'data/code'}
        """
        return dict(self._named_sources())

    def _named_sources(self) -> list[tuple[str, str]]:
        return [
            tuple(value.split("=", 1)) if "=" in value else (Path(value).name or value, value)
            for value in self.retained_dataset_name
        ]
