"""Each method's learning rate, chosen on the validation curves: the rate that drifts least at one level of the
baseline's gain, by the one matching rule (`kinfolk.drift.levels`, which `kinfolk drift` and new lab versions use):

1. the **selection level** is the level at `--selection_fraction` (default 0.5) of the baseline's gain
   (`kinfolk.drift.levels.gain_level`, over the baseline's runs grouped by rate);
2. a rate's drift at the level is the geometric mean over its seeds of each run's drift when it first reached the
   level (`kinfolk.drift.levels.seeds_drift`); a rate with a seed that never reaches the level has none;
3. the chosen rate is the one with the least drift at the level; ties go to the lower rate. When no rate reaches
   it with every seed, the rate whose seeds reach the highest mean best score is chosen instead, and the choice
   says so.

Every method, the baseline included, is chosen by the same rule at the same level.

>>> from kinfolk.drift import Run
>>> slow = Run("lora", "0", "a", [(0, 0.0, 0.0), (2, 1.0, 0.02), (4, 2.0, 0.08)])
>>> fast = Run("lora", "0", "b", [(0, 0.0, 0.0), (2, 2.0, 0.04), (4, 4.0, 0.4)])
>>> choice = choose_rate("lora", {1e-4: [slow], 1e-3: [fast]}, level=2.0)
>>> choice.rate, {rate: round(drift, 6) for rate, drift in choice.drift_by_rate.items()}  # slow 0.08, fast 0.04
(0.001, {'0.0001': 0.08, '0.001': 0.04})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kinfolk.drift import Run
from kinfolk.drift.levels import LEVEL_RULE, seeds_drift

LEAST_DRIFT = "least drift at the selection level"
HIGHEST_BEST = "no rate reached the selection level with every seed: the highest mean best score"
RULE = (
    f"each method's learning rate is the one whose runs drift least at the selection level ({LEVEL_RULE}); ties go "
    "to the lower rate; a rate with a seed that never reaches the level is not eligible, and when no rate is, the "
    "rate with the highest mean best score is chosen"
)


@dataclass(frozen=True)
class RateChoice:
    """One method's chosen rate, and what every rate scored under the rule (`%g` rate -> value)."""

    method: str
    rate: float
    how: str  # LEAST_DRIFT or HIGHEST_BEST
    level: float
    drift_by_rate: dict[str, float | None]  # None: a seed never reached the level
    best_by_rate: dict[str, float]  # mean over seeds of each run's best score


def choose_rate(method: str, runs_by_rate: Mapping[float, Sequence[Run]], level: float) -> RateChoice:
    """The rule of the module docstring for one method's runs, grouped by learning rate."""
    rates = sorted(runs_by_rate)
    drift = {rate: seeds_drift(runs_by_rate[rate], level) for rate in rates}
    best = {rate: float(np.mean([run.envelope()[-1][1] for run in runs_by_rate[rate]])) for rate in rates}
    eligible = [rate for rate in rates if drift[rate] is not None]
    if eligible:
        chosen, how = min(eligible, key=lambda rate: drift[rate]), LEAST_DRIFT  # `min` keeps the lower of ties
    else:
        chosen, how = max(rates, key=lambda rate: (best[rate], -rate)), HIGHEST_BEST
    return RateChoice(
        method, chosen, how, level, {f"{rate:g}": drift[rate] for rate in rates}, {f"{r:g}": best[r] for r in rates}
    )
