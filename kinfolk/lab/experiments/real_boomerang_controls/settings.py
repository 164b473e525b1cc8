"""What the real-boomerang version 2 plan fixes before its runs: version 1's teacher, student and training budget,
the arms, and a measurement drawn per seed from larger held-out pools.

>>> settings = RealBoomerangControlsSettings()
>>> settings.arms, settings.measured_rows_per_source, settings.measured_length
(['distilled', 'ce-only', 'undistilled'], 32, 64)
>>> settings.pretraining_rows, settings.sft_rows
(160, 160)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinfolk.lab.methods.two_phase import TwoPhaseBudget
from kinfolk.lab.protocol.settings import RealModelSettings

ARMS = ["distilled", "ce-only", "undistilled"]
# The arms' distillation-term weights: None keeps `LayerDistillationConfig`'s (ADAPT's) default.
LOSS_WEIGHTS = {"distilled": {}, "ce-only": {"kl_weight": 0.0, "cosine_weight": 0.0}}


@dataclass(frozen=True)
class RealBoomerangControlsSettings(TwoPhaseBudget, RealModelSettings):  # its `model` is the teacher
    layers: dict = field(
        default_factory=lambda: {"every": 2, "last": 1}, metadata={"help": "the student's layer selection"}
    )
    arms: list[str] = field(
        default_factory=lambda: list(ARMS),
        metadata={"help": "distilled (ADAPT's loss), ce-only (cross-entropy alone: the same rows, steps and "
                          "schedule), undistilled (layer dropping alone)"},
    )  # fmt: skip
    steps: int = field(default=80, metadata={"help": "optimiser steps of the two-phase training (both trained arms)"})
    batch_size: int = field(default=4, metadata={"help": "rows per optimiser step"})
    max_length: int = field(default=128, metadata={"help": "tokens per training row"})
    learning_rate: float = field(default=3e-4, metadata={"help": "ADAPT's learning rate (both trained arms)"})
    pretraining_fraction: float = field(default=0.5, metadata={"help": "share of the steps on pre-training text"})
    patched_blocks: int = field(
        default=16, metadata={"help": "M, the student's blocks (sizes k = 0..M); a run with another M is refused"}
    )
    measured_rows_per_source: int = field(
        default=32, metadata={"help": "held-out rows per source each seed draws from the pool and measures"}
    )
    measured_length: int = field(default=64, metadata={"help": "tokens per measured row"})
    chat_prompts: int = field(
        default=264, metadata={"help": "instructions the teacher answers (train + held-out pool: 81 held out)"}
    )
    answer_tokens: int = field(default=48, metadata={"help": "greedy tokens per teacher answer"})
    seeds: list[int] = field(
        default_factory=lambda: [0, 1, 2, 3, 4],
        metadata={"help": "units: each draws its measured rows, its training rows and their order"},
    )
    work: str = field(
        default="runs/real-boomerang-controls", metadata={"help": "students, caches and logs (not committed)"}
    )
    records: str = field(
        default="docs/results/real-boomerang-controls-units",
        metadata={"help": "each seed's measured rows and per-size numbers (committed)"},
    )
