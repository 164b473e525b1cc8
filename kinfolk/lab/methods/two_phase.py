"""The budget of ADAPT's two-phase training on a real checkpoint, as its settings derive it.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Budget(TwoPhaseBudget):
...     steps: int = 10
...     batch_size: int = 3
...     pretraining_fraction: float = 0.5
>>> budget = Budget()
>>> budget.pretraining_steps, budget.pretraining_rows, budget.sft_rows
(5, 15, 15)
"""

from __future__ import annotations

from pathlib import Path


class TwoPhaseBudget:
    """What a real-boomerang settings dataclass derives from its budget fields (`steps`, `batch_size`,
    `pretraining_fraction`, `model`): a field-less base, so each version's plan keeps its own fields and their order."""

    steps: int
    batch_size: int
    pretraining_fraction: float

    @property
    def pretraining_steps(self) -> int:
        return int(self.steps * self.pretraining_fraction)

    @property
    def pretraining_rows(self) -> int:
        """Rows drawn for the first phase: one pass, no row seen twice."""
        return self.rows_for(self.steps)[0]

    @property
    def sft_rows(self) -> int:
        """Rows drawn for the second phase (drawn with replacement where the training prompts are fewer)."""
        return self.rows_for(self.steps)[1]

    def rows_for(self, steps: int) -> tuple[int, int]:
        """(pre-training rows, SFT rows) of a two-phase training of `steps` steps (a version may train some arms
        longer than `steps`)."""
        pretraining_steps = int(steps * self.pretraining_fraction)
        return pretraining_steps * self.batch_size, (steps - pretraining_steps) * self.batch_size

    def teacher_dir(self) -> Path:
        """The teacher's directory: the settings' model."""
        return self.model_dir()
