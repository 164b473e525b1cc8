"""PEFT's forgetting figure beside the KL: a retained source's NLL per token where a run first reaches a level minus
its NLL at step 0 (logged with `--retained_nll`, on the split the verdicts read). The point on the run is the one
matching rule's (`kinfolk.drift.Run.drift_at`): found on the validation target, the NLL read between the same two
checkpoints, interpolated as the drift is. Positive: the model got worse at the retained text.

>>> from kinfolk.drift import Run
>>> run = Run("lora", "0", "", [(0, 0.0, 0.0), (4, 1.0, 0.01), (8, 2.0, 0.04)])
>>> round(forgetting_at(run, 2.0, {0: 3.0, 4: 3.1, 8: 3.3}), 6)  # reached at step 8
0.3
>>> forgetting_at(run, 2.5, {0: 3.0, 4: 3.1, 8: 3.3}) is None  # never reached
True
"""

from __future__ import annotations

from collections.abc import Mapping

from kinfolk.drift import Run
from kinfolk.drift.matching import START_STEP


def forgetting_at(run: Run, level: float, nll: Mapping[int, float]) -> float | None:
    """The NLL where `run` first reaches `level` minus the NLL at step 0 (`nll`: step -> NLL per token); None when
    the run never reaches the level or the NLL was not logged at its steps."""
    steps = [step for step, _, _ in run.envelope()]
    if START_STEP not in nll or any(step not in nll for step in steps):
        return None
    at = run.drift_at(level, nll).drift
    return None if at is None else at - nll[START_STEP]
