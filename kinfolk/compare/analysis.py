"""From every run's curve to the comparison: each method's rate (`selection`), then the verdicts at its chosen rate
(`verdicts`).

>>> from kinfolk.compare.grid import RunKey
>>> from kinfolk.drift import Run
>>> def run(method, rate, seed, drift):
...     return RunKey(method, rate, seed), Run(method, str(seed), f"{method}/{rate}/{seed}",
...                                            [(0, 0.0, 0.0), (2, 2.0, drift * (1 + seed / 10))])
>>> runs = dict([run("lora", 1e-3, 0, 0.04), run("lora", 1e-2, 0, 0.08),
...              run("atlas", 1e-3, 0, 0.03), run("atlas", 1e-2, 0, 0.02)])
>>> analysis = analyse(runs, baseline="lora", selection_fraction=0.5, fractions=[0.5])
>>> {choice.method: choice.rate for choice in analysis.choices}
{'lora': 0.001, 'atlas': 0.01}
>>> analysis.verdicts[0].line
"atlas vs lora at target 1 (50% of lora's gain): not significant (ratio 0.5 over 1 seed; an interval needs 5; drift 0.01 vs 0.02)"
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kinfolk.compare.grid import RunKey
from kinfolk.compare.selection import RULE, RateChoice, choose_rate, selection_level
from kinfolk.compare.verdicts import Verdict, verdicts
from kinfolk.drift import Run


@dataclass(frozen=True)
class Analysis:
    """What the report shows: the runs, each method's rate choice, the chosen runs and the verdicts."""

    baseline: str
    selection_fraction: float
    selection_level: float
    rule: str
    choices: list[RateChoice]
    fractions: list[float]
    verdicts: list[Verdict]
    runs: dict[RunKey, Run]

    def chosen_runs(self) -> list[Run]:
        """The runs at each method's chosen rate, methods in grid order."""
        return at_chosen_rates(self.runs, self.choices)


def at_chosen_rates(runs: Mapping[RunKey, Run], choices: Sequence[RateChoice]) -> list[Run]:
    rates = {choice.method: choice.rate for choice in choices}
    return [run for key, run in runs.items() if key.learning_rate == rates[key.method]]


def analyse(
    runs: Mapping[RunKey, Run], baseline: str, selection_fraction: float, fractions: Sequence[float]
) -> Analysis:
    """Choose each method's rate at the selection level, then judge every method against `baseline` at the chosen
    rates, level by level."""
    methods = list(dict.fromkeys(key.method for key in runs))
    level = selection_level([run for key, run in runs.items() if key.method == baseline], selection_fraction)
    choices = []
    for method in methods:
        by_rate: dict[float, list[Run]] = {}
        for key, run in runs.items():
            if key.method == method:
                by_rate.setdefault(key.learning_rate, []).append(run)
        choices.append(choose_rate(method, by_rate, level))
    judged = verdicts(at_chosen_rates(runs, choices), baseline, fractions)
    return Analysis(baseline, selection_fraction, level, RULE, choices, list(fractions), judged, dict(runs))
