"""What a real-boomerang plan fixes before its runs: the teacher, the student's layers, the distillation budget,
the sources and sizes of the held-out measurement, and the seeds.

>>> settings = BoomerangSettings()
>>> settings.seeds, settings.steps, settings.layers
([0, 1, 2, 3, 4], 80, {'every': 2, 'last': 1})
>>> settings.pretraining_rows, settings.sft_rows
(160, 160)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinfolk.lab.methods.two_phase import TwoPhaseBudget
from kinfolk.lab.protocol.settings import RealModelSettings


@dataclass(frozen=True)
class BoomerangSettings(TwoPhaseBudget, RealModelSettings):  # its `model` is the teacher
    layers: dict = field(
        default_factory=lambda: {"every": 2, "last": 1}, metadata={"help": "the student's layer selection"}
    )
    seeds: list[int] = field(
        default_factory=lambda: [0, 1, 2, 3, 4],
        metadata={"help": "units: each draws the training rows and their order"},
    )
    steps: int = field(default=80, metadata={"help": "optimiser steps of the two-phase distillation"})
    batch_size: int = field(default=4, metadata={"help": "rows per optimiser step"})
    max_length: int = field(default=128, metadata={"help": "tokens per training and measurement row"})
    learning_rate: float = field(default=3e-4, metadata={"help": "ADAPT's learning rate"})
    pretraining_fraction: float = field(default=0.5, metadata={"help": "share of the steps on pre-training text"})
    heldout_rows_per_source: int = field(default=6, metadata={"help": "measurement rows per held-out source"})
    chat_prompts: int = field(default=120, metadata={"help": "instructions the teacher answers (train + held-out)"})
    answer_tokens: int = field(default=48, metadata={"help": "greedy tokens per teacher answer"})
    work: str = field(default="runs/real-boomerang", metadata={"help": "students, caches and logs (not committed)"})
    records: str = field(
        default="docs/results/real-boomerang-units", metadata={"help": "each seed's per-size numbers (committed)"}
    )
