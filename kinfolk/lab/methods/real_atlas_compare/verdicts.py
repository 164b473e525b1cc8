"""A seed's comparison as `kinfolk compare` computes it: the record's curves become compare's `Run`s, Output-KL's
strength is chosen by compare's rate rule (`kinfolk.compare.selection.choose_rate`, on validation, the strengths in
the place of rates) and `kinfolk.compare.analysis.analyse` judges every method against LoRA at LoRA's levels; the
comparisons of ATLAS with its other alternatives are `kinfolk.compare.verdicts.verdicts` with that alternative as
the baseline, at the same levels. One seed is one unit: its verdicts' ratios are the seed's ratios.

A record (`runs.curves_record`) holds per run its method, rate, Output-KL strength, validation checkpoints (step,
target, drift) and test ones (`test`: the drift, each source's (step, target, KL) and NLL per step).

>>> record = {"seed": 0, "output_kl_coefs": [1.0, 3.0], "runs": {
...     "lora": run("lora", [(0, 0.0, 0.0), (4, 2.0, 0.04)]), "atlas": run("atlas", [(0, 0.0, 0.0), (4, 2.0, 0.02)]),
...     "kl-1": run("lora_output_kl", [(0, 0.0, 0.0), (4, 2.0, 0.03)], 1.0),
...     "kl-3": run("lora_output_kl", [(0, 0.0, 0.0), (4, 1.0, 0.01)], 3.0)}}
>>> choose_strength(record, 0.5)  # at target 1: drift 0.015 with strength 1, 0.01 with 3 (reached at its best)
3.0
>>> comparison = seed_comparison(record, 1.0, 0.5, [0.5])
>>> {(v.method, v.baseline): round(v.ratio, 3) for v in comparison.verdicts}
{('atlas', 'lora'): 0.5, ('lora_output_kl', 'lora'): 0.75, ('atlas', 'lora_output_kl'): 0.667}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kinfolk.compare.analysis import Analysis, analyse
from kinfolk.compare.forgetting import forgetting_at
from kinfolk.compare.grid import RunKey
from kinfolk.compare.selection import choose_rate
from kinfolk.compare.verdicts import Verdict, verdicts
from kinfolk.drift import Run
from kinfolk.drift.levels import GainLevel, gain_level
from kinfolk.lab.methods.real_atlas_compare.settings import BASELINE, OUTPUT_KL

METHOD = "atlas"


def run(method: str, validation: Sequence[Sequence[float]], coef: float | None = None) -> dict[str, Any]:
    """A record's run whose test curves equal its validation ones (for examples and hand checks)."""
    points = [list(point) for point in validation]
    return {"method": method, "learning_rate": 1e-3, "output_kl_coef": coef, "validation": points,
            "test": {"drift": points, "sources": {}, "nll": {}}}  # fmt: skip


def curve(record: Mapping[str, Any], name: str, split: str = "validation", source: str | None = None) -> Run:
    """One run's curve as compare's `Run`: validation, test (its drift) or one source's test KL."""
    kept = record["runs"][name]
    if split == "validation":
        points = kept["validation"]
    else:
        points = kept["test"]["drift"] if source is None else kept["test"]["sources"][source]
    return Run(kept["method"], str(record["seed"]), name, [tuple(point) for point in points])


def names_of(record: Mapping[str, Any], method: str, coef: float | None = None) -> list[str]:
    """The record's runs of `method` (of Output-KL, at strength `coef`)."""
    return [name for name, kept in record["runs"].items() if kept["method"] == method
            and (method != OUTPUT_KL or coef is None or kept["output_kl_coef"] == coef)]  # fmt: skip


def baseline_level(record: Mapping[str, Any], fraction: float) -> GainLevel:
    """compare's level at `fraction` of LoRA's gain on the seed (its runs grouped by rate), on validation."""
    return gain_level(fraction, [[curve(record, name)] for name in names_of(record, BASELINE)])


def choose_strength(record: Mapping[str, Any], selection_fraction: float) -> float:
    """Output-KL's strength for the seed: compare's rate rule over the strengths, at `selection_fraction` of LoRA's
    validation gain (validation only)."""
    level = baseline_level(record, selection_fraction)
    by_coef = {coef: [curve(record, name) for name in names_of(record, OUTPUT_KL, coef)]
               for coef in record["output_kl_coefs"]}  # fmt: skip
    return choose_rate(OUTPUT_KL, by_coef, level.value).rate


@dataclass(frozen=True)
class SeedComparison:
    """compare's analysis of one seed (every method against LoRA) and ATLAS against each other method."""

    analysis: Analysis
    verdicts: list[Verdict]  # compare's (each method against LoRA), then ATLAS against each other method
    nll: dict[str, dict[str, dict[int, float]]]  # chosen method -> source -> step -> test NLL
    test_target: dict[str, dict[int, float]]  # chosen method -> step -> test target score


def seed_comparison(
    record: Mapping[str, Any], coef: float, selection_fraction: float, fractions: Sequence[float]
) -> SeedComparison:
    """compare's analysis of the seed's runs with Output-KL at strength `coef` (each method's rate chosen on
    validation by compare's rule), verdicts on test."""
    names = [name for name in record["runs"] if record["runs"][name]["method"] != OUTPUT_KL]
    names += names_of(record, OUTPUT_KL, coef)
    keys = {name: RunKey(record["runs"][name]["method"], record["runs"][name]["learning_rate"], record["seed"])
            for name in names}  # fmt: skip
    validation = {keys[name]: curve(record, name) for name in names}
    test = {keys[name]: curve(record, name, "test") for name in names}
    sources = {keys[name]: {source: curve(record, name, "test", source) for source in record["runs"][name]["test"]
                            ["sources"]} for name in names}  # fmt: skip
    analysis = analyse(validation, BASELINE, selection_fraction, fractions, test=test, sources=sources)
    chosen = analysis.chosen_runs()
    by_method = {(key.method, str(key.seed)): test[key] for key in validation if validation[key] in chosen}
    others = [choice.method for choice in analysis.choices if choice.method not in (BASELINE, METHOD)]
    against = [
        verdict
        for other in others
        for verdict in verdicts([r for r in chosen if r.method in (METHOD, other)], other, analysis.levels, by_method)
    ]
    nll = {record["runs"][run.path]["method"]: {source: {int(step): value for step, value in steps.items()}
                                                for source, steps in record["runs"][run.path]["test"]["nll"].items()}
           for run in chosen}  # fmt: skip
    test_target = {record["runs"][run.path]["method"]: {int(step): target for step, target, _ in
                                                        record["runs"][run.path]["test"]["drift"]}
                   for run in chosen}  # fmt: skip
    return SeedComparison(analysis, [*analysis.verdicts, *against], nll, test_target)


def source_drifts(comparison: SeedComparison, level: GainLevel) -> dict[str, dict[str, float | None]]:
    """Each chosen method's KL per source at `level` (compare's source rows)."""
    index = comparison.analysis.levels.index(level)
    drifts: dict[str, dict[str, float | None]] = {}
    for row in comparison.analysis.sources:
        drifts.setdefault(row.method, {})[row.source] = row.drifts[index]
    return drifts


def test_gains(comparison: SeedComparison, level: GainLevel) -> dict[str, float | None]:
    """Each chosen method's test target gain where it reaches `level` on validation: the test score there minus at
    step 0, read between the same checkpoints as its drift (the match is found on validation, so test gains can part).

    >>> record = {"seed": 0, "output_kl_coefs": [1.0], "runs": {
    ...     "lora": run("lora", [(0, 0.0, 0.0), (4, 2.0, 0.04)]), "atlas": run("atlas", [(0, 0.0, 0.0), (4, 2.0, 0.02)]),
    ...     "kl-1": run("lora_output_kl", [(0, 0.0, 0.0), (4, 2.0, 0.03)], 1.0)}}
    >>> comparison = seed_comparison(record, 1.0, 0.5, [0.5])
    >>> test_gains(comparison, comparison.analysis.levels[0])  # test equals validation here: half of 2 each
    {'lora': 1.0, 'atlas': 1.0, 'lora_output_kl': 1.0}
    """
    # forgetting_at is the change from step 0 at the matched point, whatever the logged value: here the test target
    return {run.method: forgetting_at(run, level.value, comparison.test_target[run.method])
            for run in comparison.analysis.chosen_runs()}  # fmt: skip


def forgetting(comparison: SeedComparison, level: GainLevel) -> dict[str, float | None]:
    """Each chosen method's forgetting at `level` (`kinfolk.compare.forgetting.forgetting_at`), mean over sources."""
    found = {}
    for run in comparison.analysis.chosen_runs():
        values = [forgetting_at(run, level.value, steps) for steps in comparison.nll[run.method].values()]
        found[run.method] = None if not values or None in values else sum(values) / len(values)
    return found
