"""The one matching rule: what a target level is, and a method's drift there over seeds. `kinfolk compare` chooses
its rates and states its verdicts with it, `kinfolk drift` summarises its methods with it, and new lab versions
choose with it (`kinfolk.lab.methods.selection` keeps the lab's earlier rule for the versions it pins).

- **A level** is a fraction of the baseline's gain: start + fraction x (reference - start), `start` the mean
  untouched (step-0) score of the baseline's runs and `reference` the highest score that every run of one group of
  them reaches: the best, over groups (a learning rate's seeds), of the group's lowest best score. So a level up to
  fraction 1 is reached by every seed of at least one baseline rate, and one reference serves every fraction: the
  rate choice's level and the verdicts' levels are points of one scale (`GainLevel`, shown as one number);
- **a run's drift at a level** is its drift when it first reached the level, read off its running-maximum
  envelope and interpolated, never extrapolated (`kinfolk.drift.Run.drift_at`);
- **drift over several retained sources** is the geometric mean of their KLs, each floored at `KL_FLOOR`
  (`sources_drift`, the lab's definition too);
- **a method's drift at a level** is the geometric mean of its seeds' drifts (`seeds_drift`, `kinfolk.stats.seeds_geometric_mean`): None when a seed
  never reaches the level, 0 when a seed reaches it undrifted (the untouched start), whose log the mean cannot take
  and whose product is 0.

>>> from kinfolk.drift import Run
>>> slow = [Run("lora", s, "", [(0, 0.0, 0.0), (2, 1.0, 0.02), (4, b, 0.08)]) for s, b in (("0", 2.0), ("1", 3.0))]
>>> fast = [Run("lora", s, "", [(0, 0.0, 0.0), (2, 4.0, 0.04)]) for s in ("0", "1")]
>>> level = gain_level(0.5, [slow, fast])  # reference: fast's lowest best 4 beats slow's 2
>>> level.value, level.describe()
(2.0, "2 (50% of the baseline's gain, from 0 to 4)")
>>> round(seeds_drift(slow, 2.0), 6), seeds_drift(fast, 2.0)  # slow: 0.08 and 0.04; fast: 0.02 each (linear)
(0.056569, 0.02)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kinfolk.drift.matching import START_STEP, Run
from kinfolk.errors import InputError
from kinfolk.stats import seeds_geometric_mean

KL_FLOOR = 1e-12  # a trained checkpoint's KL is positive; the floor only guards log(0)
LEVEL_RULE = (
    "a level is start + fraction x (reference - start): start the baseline runs' mean step-0 score, reference the "
    "best over the baseline's learning rates of the lowest best score among that rate's seeds; a method's drift at a "
    "level is the geometric mean over its seeds of each run's drift on first reaching it (interpolated on the run's "
    "running-maximum envelope, never extrapolated; none when a seed never reaches it)"
)


@dataclass(frozen=True)
class GainLevel:
    """One target level of the comparison, as a fraction of the baseline's gain (see the module)."""

    fraction: float
    start: float
    reference: float
    value: float

    def describe(self) -> str:
        """The level as one number with where it comes from, as every report states it."""
        gain = f"{self.fraction:.0%} of the baseline's gain, from {self.start:.4g} to {self.reference:.4g}"
        return f"{self.value:.4g} ({gain})"


def start_score(runs: Sequence[Run]) -> float:
    """The mean target score of the runs' untouched start (step 0)."""
    starts = [target for run in runs for step, target, _ in run.checkpoints if step == START_STEP]
    if not starts:
        raise InputError(f"no run of {sorted({run.method for run in runs})} measured its start (step {START_STEP})")
    return float(np.mean(starts))


def gain_level(fraction: float, baseline_groups: Sequence[Sequence[Run]]) -> GainLevel:
    """The level at `fraction` of the baseline's gain; `baseline_groups` its runs grouped by learning rate."""
    runs = [run for group in baseline_groups for run in group]
    start = start_score(runs)
    reference = max(min(run.envelope()[-1][1] for run in group) for group in baseline_groups if group)
    return GainLevel(fraction, start, reference, start + fraction * (reference - start))


def seeds_drift(runs: Sequence[Run], level: float) -> float | None:
    """A method's drift at `level` over its seeds' runs (see the module)."""
    return seeds_geometric_mean([run.drift_at(level).drift for run in runs])


def reached_fraction(runs: Sequence[Run], scale: GainLevel) -> float | None:
    """The share of the baseline's gain (on `scale`'s start and reference) that every one of `runs` reaches: the
    highest level all of its seeds reach, as a fraction; None when the scale has no gain (reference <= start).

    >>> from kinfolk.drift import Run
    >>> runs = [Run("atlas", s, "", [(0, 0.0, 0.0), (4, best, 0.01)]) for s, best in (("0", 3.0), ("1", 2.0))]
    >>> reached_fraction(runs, GainLevel(0.5, 0.0, 4.0, 2.0))  # the weaker seed's best, 2, of the gain 0 -> 4
    0.5
    """
    if scale.reference <= scale.start:
        return None
    lowest_best = min(run.envelope()[-1][1] for run in runs)
    return (lowest_best - scale.start) / (scale.reference - scale.start)


def sources_drift(kls: Iterable[float]) -> float:
    """The drift over retained sources: the geometric mean of their KLs, each floored at `KL_FLOOR`.

    >>> round(sources_drift([0.01, 0.04]), 12), round(sources_drift([0.0, 1.0]), 12)  # 0 counts as 1e-12
    (0.02, 1e-06)
    """
    values = [max(kl, KL_FLOOR) for kl in kls]
    return math.exp(sum(math.log(value) for value in values) / len(values))
