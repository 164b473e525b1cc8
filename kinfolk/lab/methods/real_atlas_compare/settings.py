"""What the real-atlas version 2 plan fixes before its runs: the model, the data draw, and `kinfolk compare`'s
options for every arm of a seed (an arm is one method at its learning rate, Output-KL once per strength).

Each method's learning rates and Output-KL's first strength grid were fixed by the pilot (seed `PILOT_SEED`, not a
unit; `docs/results/real-atlas-compare.plan.json`'s notes say what it saw). Within a unit, Output-KL's strength is
chosen on the seed's validation split by compare's rule, and its grid is extended by one step (`kinfolk.compare.
grid_edge.extended_grid`) while the choice sits on an edge, at most `output_kl_extensions` times.

>>> settings = RealAtlasCompareSettings()
>>> settings.methods, settings.output_kl_coefs
(['lora', 'atlas', 'norm_matched', 'lora_output_kl'], [0.3, 1.0, 3.0])
>>> settings.compare_options()["eval_points"], settings.compare_options()["max_steps"]
(7, 48)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinfolk.lab.protocol.settings import RealModelSettings, real_models_root

BASELINE = "lora"
OUTPUT_KL = "lora_output_kl"
PILOT_SEED = 999  # not a unit


@dataclass(frozen=True)
class RealAtlasCompareSettings(RealModelSettings):
    methods: list[str] = field(
        default_factory=lambda: ["lora", "atlas", "norm_matched", OUTPUT_KL],
        metadata={"help": "kinfolk compare's methods (its registry's names); the first is the baseline"},
    )
    learning_rates: dict = field(
        default_factory=lambda: {"lora": [3e-3], "atlas": [1e-2], "norm_matched": [1e-2], OUTPUT_KL: [3e-3]},
        metadata={"help": "each method's learning-rate grid (compare's --method_learning_rates; the pilot's)"},
    )
    output_kl_coefs: list[float] = field(
        default_factory=lambda: [0.3, 1.0, 3.0],
        metadata={"help": "Output-KL's strength grid, chosen from on each seed's validation split"},
    )
    output_kl_extensions: int = field(
        default=2, metadata={"help": "grid steps added at most while the chosen strength sits on an edge"}
    )
    levels: list[float] = field(
        default_factory=lambda: [0.25, 0.5, 0.75],
        metadata={"help": "verdict levels, fractions of LoRA's gain (compare's --levels)"},
    )
    selection_fraction: float = field(
        default=0.5, metadata={"help": "the level Output-KL's strength is chosen at (compare's --selection_fraction)"}
    )
    max_steps: int = field(default=48, metadata={"help": "optimiser steps of every run"})
    eval_points: int = field(
        default=7, metadata={"help": "measured steps after step 0, spaced geometrically (compare's --eval_points)"}
    )
    batch_size: int = field(default=4, metadata={"help": "training rows per step"})
    max_length: int = field(default=96, metadata={"help": "tokens per training and measured row"})
    rank: int = field(default=16, metadata={"help": "rank of LoRA and ATLAS at ATLAS's default placement"})
    held_out_rows: int = field(
        default=64, metadata={"help": "rows per source (target and each retained one) in validation and in test"}
    )
    fit_rows: int = field(
        default=32, metadata={"help": "training rows per retained source: the ATLAS fit and Output-KL's rows"}
    )
    chat_prompts: int = field(default=264, metadata={"help": "instructions the frozen model answers (the pool)"})
    answer_tokens: int = field(default=48, metadata={"help": "greedy tokens per chat answer"})
    churn_prompts: int = field(default=64, metadata={"help": "chat prompts whose greedy answers each run keeps"})
    prose_file: str = field(
        default="", metadata={"help": "the Sonnets' text; empty: the one `make real-models` installs"}
    )
    seeds: list[int] = field(
        default_factory=lambda: [0, 1, 2, 3, 4],
        metadata={"help": "units: each draws its rows from the pools, its training order and its adapters' init"},
    )
    work: str = field(default="runs/real-atlas-compare", metadata={"help": "data, runs and caches (not committed)"})
    records: str = field(
        default="docs/results/real-atlas-compare-units",
        metadata={"help": "each seed's drawn rows and every run's drift.jsonl and run.json (committed)"},
    )

    def prose_path(self) -> Path:
        return Path(self.prose_file) if self.prose_file else real_models_root() / "texts" / "shakespeare-sonnets.txt"

    def compare_options(self) -> dict[str, Any]:
        """The `CompareArguments` every arm of every seed shares (data paths, method, rate and seed are the arm's)."""
        return {
            "max_steps": self.max_steps,
            "eval_steps": self.max_steps,  # the trainer's logging interval: measured at `eval_points` steps instead
            "eval_points": self.eval_points,
            "retained_nll": True,
            "per_device_train_batch_size": self.batch_size,
            "max_length": self.max_length,
            "rank": self.rank,
            "churn_prompts": self.churn_prompts,
            "test_split": "test",
            "retained_kl_split": "validation",
            "dtype": "float32",
            "use_cpu": True,
        }
