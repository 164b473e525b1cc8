"""From every run's curve to the comparison: each method's rate (`selection`), then the verdicts at its chosen rate
(`verdicts`; read on the test curves when there are some, corrected by Holm when the comparison was planned) and
each retained source's drift at every verdict level (`SourceRow`).

>>> from kinfolk.compare.grid import RunKey
>>> from kinfolk.drift import Run
>>> def run(method, rate, seed, drift):
...     return RunKey(method, rate, seed), Run(method, str(seed), f"{method}/{rate}/{seed}",
...                                            [(0, 0.0, 0.0), (2, 2.0, drift * (1 + seed / 10))])
>>> runs = dict([run("lora", 1e-3, 0, 0.04), run("lora", 1e-2, 0, 0.08),
...              run("atlas", 1e-3, 0, 0.03), run("atlas", 1e-2, 0, 0.02)])
>>> analysis = analyse(runs, baseline="lora", selection_fraction=0.5, fractions=[0.5])
>>> analysis.selection.describe()  # lora's reference: 2, the lowest best of its best-reaching rate's seeds
"1 (50% of the baseline's gain, from 0 to 2)"
>>> {choice.method: choice.rate for choice in analysis.choices}
{'lora': 0.001, 'atlas': 0.01}
>>> analysis.verdicts[0].line
"atlas vs lora at target 1 (50% of lora's gain): not tested (1 seed; an interval needs 5): ratio 0.5, drift 0.01 vs 0.02"
>>> analysis.reached  # both reach all of lora's gain
{'lora': 1.0, 'atlas': 1.0}
>>> print(analysis.edge_warnings[1])  # two rates: each choice is at an end
atlas: the chosen --learning_rates 0.01 is the largest of its grid (0.001 0.01); a larger one may do better: extend the grid, e.g. --learning_rates 0.001 0.01 0.1
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kinfolk.compare.forgetting import forgetting_at
from kinfolk.compare.grid import RunKey
from kinfolk.compare.grid_edge import edge_warning
from kinfolk.compare.selection import RULE, RateChoice, choose_rate
from kinfolk.compare.verdicts import TEST, VALIDATION, Verdict, holm_corrected, verdicts
from kinfolk.drift import Run
from kinfolk.drift.levels import GainLevel, gain_level, reached_fraction
from kinfolk.hints import suggest
from kinfolk.stats import seeds_geometric_mean

RATES_OPTION = suggest("--learning_rates", "compare")  # the grid an edge warning suggests extending


@dataclass(frozen=True)
class SourceRow:
    """One method's drift on one retained source at each verdict level (geometric mean over its chosen seeds, read
    where each run first reached the level on validation, on the verdicts' split)."""

    method: str
    source: str
    drifts: list[float | None]
    forgetting: list[float | None] | None = None  # mean over seeds (`kinfolk.compare.forgetting`); None: not logged


@dataclass(frozen=True)
class Analysis:
    """What the report shows: the runs, each method's rate choice, the chosen runs and the verdicts."""

    baseline: str
    selection: GainLevel  # the level the rates are chosen at
    rule: str
    choices: list[RateChoice]
    levels: list[GainLevel]  # the verdicts' levels, on the selection level's scale
    verdicts: list[Verdict]
    runs: dict[RunKey, Run]  # validation curves
    split: str = VALIDATION  # the split the verdicts read
    planned: bool = False  # verdicts corrected by Holm over the plan's primaries
    sources: list[SourceRow] = field(default_factory=list)
    reached: dict[str, float | None] = field(default_factory=dict)  # per method: the share of the gain it reaches
    edge_warnings: list[str] = field(default_factory=list)  # chosen rates at their grid's end (`grid_edge`)
    # with a test split: each chosen run's test drift by step, keyed by (method, seed) as `verdicts` pairs them
    test_drifts: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)

    @property
    def selection_fraction(self) -> float:
        return self.selection.fraction

    @property
    def selection_level(self) -> float:
        return self.selection.value

    @property
    def fractions(self) -> list[float]:
        return [level.fraction for level in self.levels]

    def chosen_runs(self) -> list[Run]:
        """The runs at each method's chosen rate, methods in grid order."""
        return at_chosen_rates(self.runs, self.choices)

    def judged_runs(self) -> list[Run]:
        """The chosen runs as the verdicts read them: each checkpoint's validation target (where a level is
        reached) with the drift of the verdicts' split (the test drift at that step, when there is a test split)."""
        if not self.test_drifts:
            return self.chosen_runs()
        return [
            Run(run.method, run.seed, run.path, [(step, target, self.test_drifts[run.method, run.seed][step])
                                                 for step, target, _ in run.checkpoints])
            for run in self.chosen_runs()
        ]  # fmt: skip


def at_chosen_rates(runs: Mapping[RunKey, Run], choices: Sequence[RateChoice]) -> list[Run]:
    rates = {choice.method: choice.rate for choice in choices}
    return [run for key, run in runs.items() if key.learning_rate == rates[key.method]]


def analyse(
    runs: Mapping[RunKey, Run],
    baseline: str,
    selection_fraction: float,
    fractions: Sequence[float],
    test: Mapping[RunKey, Run] | None = None,
    sources: Mapping[RunKey, Mapping[str, Run]] | None = None,
    planned: bool = False,
    nll: Mapping[RunKey, Mapping[str, Mapping[int, float]]] | None = None,
) -> Analysis:
    """Choose each method's rate at the selection level on the validation curves `runs`, then judge every method
    against `baseline` at the chosen rates, level by level: every level on one scale, the baseline's gain over all
    its rates and seeds. `test`: each run's test curve, which the verdicts then read; `sources`: each run's curves
    per retained source (step, target, that source's KL on the verdicts' split); `planned`: Holm over the verdicts;
    `nll`: each run's NLL per source and step on the verdicts' split, for the forgetting beside the KL."""
    methods = list(dict.fromkeys(key.method for key in runs))
    by_rate: dict[str, dict[float, list[Run]]] = {method: {} for method in methods}
    for key, run in runs.items():
        by_rate[key.method].setdefault(key.learning_rate, []).append(run)
    baseline_groups = list(by_rate[baseline].values())
    selection = gain_level(selection_fraction, baseline_groups)
    levels = [gain_level(fraction, baseline_groups) for fraction in fractions]
    choices = [choose_rate(method, by_rate[method], selection.value) for method in methods]
    chosen = at_chosen_rates(runs, choices)
    rates = {choice.method: choice.rate for choice in choices}
    tested = None
    if test is not None:  # the chosen runs' test curves, by (method, seed) as `verdicts` pairs them
        tested = {(k.method, str(k.seed)): curve for k, curve in test.items() if k.learning_rate == rates[k.method]}
    judged = verdicts(chosen, baseline, levels, tested)
    if planned:
        judged = holm_corrected(judged)
    rows = [] if sources is None else source_rows(runs, sources, choices, levels, nll)
    split = VALIDATION if test is None else TEST
    reached = {c.method: reached_fraction([r for r in chosen if r.method == c.method], selection) for c in choices}
    edges = [edge_warning(c.method, RATES_OPTION, c.rate, list(by_rate[c.method])) for c in choices]
    test_drifts = {key: {step: drift for step, _, drift in curve.checkpoints} for key, curve in (tested or {}).items()}
    return Analysis(baseline, selection, RULE, choices, levels, judged, dict(runs), split, planned, rows, reached,
                    [edge for edge in edges if edge], test_drifts)  # fmt: skip


def source_rows(
    runs: Mapping[RunKey, Run],
    sources: Mapping[RunKey, Mapping[str, Run]],
    choices: Sequence[RateChoice],
    levels: Sequence[GainLevel],
    nll: Mapping[RunKey, Mapping[str, Mapping[int, float]]] | None = None,
) -> list[SourceRow]:
    """Each method's drift per retained source at every level, its chosen runs' points found on validation; with
    `nll`, beside it the forgetting (NLL there minus at step 0, mean over the seeds)."""
    rates = {choice.method: choice.rate for choice in choices}
    chosen = [key for key in runs if key.learning_rate == rates[key.method]]
    rows = []
    for method in rates:
        keys = [key for key in chosen if key.method == method]
        for source in sources[keys[0]]:
            kls = {key: {step: kl for step, _, kl in sources[key][source].checkpoints} for key in keys}
            drifts = [
                seeds_geometric_mean([runs[key].drift_at(level.value, kls[key]).drift for key in keys])
                for level in levels
            ]
            logged = nll is not None and all(source in nll.get(key, {}) for key in keys)
            forgetting = [_mean([forgetting_at(runs[key], level.value, nll[key][source]) for key in keys])
                          for level in levels] if logged else None  # fmt: skip
            rows.append(SourceRow(method, source, drifts, forgetting))
    return rows


def _mean(values: Sequence[float | None]) -> float | None:
    """The mean, or None when a value is missing (a seed that never reached the level)."""
    return None if not values or None in values else sum(values) / len(values)
