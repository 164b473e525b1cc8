"""When kinfolk's measuring callbacks measure: every N optimiser steps or at listed steps (`at_steps`, e.g.
`geometric_steps`: dense where a skill is learned fast), at each evaluation, at the end of training and, if asked,
before the first step; never twice at one step (an evaluation or the end falling on a step the
schedule already measured measures nothing more).

A measuring callback subclasses `MeasuredAtSteps` and says in `measure_step` what one measurement does.

>>> from types import SimpleNamespace
>>> class Steps(MeasuredAtSteps):
...     def __init__(self):
...         super().__init__(every_n_steps=2, measure_at_start=True)
...         self.measured = []
...     def measure_step(self, args, state, control):
...         self.measured.append(state.global_step)
>>> callback = Steps()
>>> callback.on_train_begin(None, SimpleNamespace(global_step=0), None)
>>> for step in (1, 2, 3):
...     callback.on_step_end(None, SimpleNamespace(global_step=step), None)
>>> callback.on_evaluate(None, SimpleNamespace(global_step=2), None)  # step 2 was measured already
>>> callback.on_train_end(None, SimpleNamespace(global_step=3), None)
>>> callback.measured
[0, 2, 3]
"""

from __future__ import annotations

from collections.abc import Collection

from transformers import TrainerCallback


class MeasuredAtSteps(TrainerCallback):
    """The schedule above; `measure_step(args, state, control)` is the subclass's measurement."""

    def __init__(
        self, every_n_steps: int | None = None, measure_at_start: bool = False, at_steps: Collection[int] | None = None
    ):
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be a positive integer, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.at_steps = frozenset(at_steps or ())
        self.measure_at_start = measure_at_start
        self._last_step: int | None = None

    def measure_step(self, args, state, control) -> None:
        raise NotImplementedError

    def measure_once(self, args, state, control) -> bool:
        """Measure at this step unless it was measured already; whether it measured."""
        if self._last_step == state.global_step:
            return False
        self._last_step = state.global_step
        self.measure_step(args, state, control)
        return True

    def on_train_begin(self, args, state, control, **kwargs):
        if self.measure_at_start and state.global_step == 0:
            self.measure_once(args, state, control)

    def on_step_end(self, args, state, control, **kwargs):
        every = self.every_n_steps and state.global_step % self.every_n_steps == 0
        if every or state.global_step in self.at_steps:
            self.measure_once(args, state, control)

    def on_evaluate(self, args, state, control, **kwargs):
        self.measure_once(args, state, control)

    def on_train_end(self, args, state, control, **kwargs):
        self.measure_once(args, state, control)


def geometric_steps(steps: int, points: int) -> list[int]:
    """`points` steps from 1 to `steps`, spaced geometrically (each gap the ratio that still reaches `steps`, never
    less than one step): a skill learned within a few steps at a high rate, or over hundreds at a low one, spans
    several of them.

    >>> geometric_steps(600, 12)
    [1, 2, 4, 7, 12, 21, 37, 65, 113, 197, 344, 600]
    >>> geometric_steps(5, 8)
    [1, 2, 3, 4, 5]
    """
    chosen = [1]
    while len(chosen) < points and chosen[-1] < steps:
        left = points - len(chosen)  # gaps still to place
        ratio = (steps / chosen[-1]) ** (1 / left)
        chosen.append(min(steps, max(chosen[-1] + 1, round(chosen[-1] * ratio))))
    return chosen
