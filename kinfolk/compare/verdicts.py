"""One line per method and level: does the method drift less than the baseline on first reaching that target?

The levels are `kinfolk.drift.levels.GainLevel`s, fractions of the baseline's gain on the one scale the rate choice
uses too (`kinfolk.compare.analysis` makes them). At each level the runs of a method and of the baseline (their
chosen rates) are paired by seed: per seed, ratio = drift(method) / drift(baseline), each read where its run first
reached the level on its validation target (`kinfolk.drift.Run.drift_at`). Without a test split the drift is the
validation one; with one (`test`), the point is still found on validation and the drift read there is the test
split's, so no choice reads test. Over seeds: the geometric mean of the ratios, from `kinfolk.stats.MIN_INTERVAL_UNITS`
(5) seeds on the exponentiated 95 % t-interval of the log ratios, and from 2 seeds the t-test's p-value (log ratio
0), which a planned comparison corrects by Holm over its primaries (`holm_corrected`).

The verdict uses kinfolk's four words (`kinfolk.verdict_words`, defined in docs/compare.md): "less drift shown" or
"more drift shown" when the interval excludes 1 (planned: when the Holm-adjusted p is below
`kinfolk.stats.HOLM_LEVEL`), "not shown" when it holds 1 (planned: when the adjusted p is not below it), "not tested
(n seeds; an interval needs 5)" when there are too few seeds for an interval (the ratio is then a measurement, not
a finding), and "not reached" when a run would reach the level only by extrapolation.

>>> from kinfolk.drift import Run
>>> from kinfolk.drift.levels import gain_level
>>> runs = [Run(m, str(s), f"{m}/{s}", [(0, 0.0, 0.0), (2, 2.0, d * (1 + s / 10))])
...         for m, d in (("lora", 0.04), ("atlas", 0.02)) for s in range(5)]
>>> level = gain_level(0.5, [[run for run in runs if run.method == "lora"]])
>>> (verdict,) = verdicts(runs, "lora", [level])
>>> verdict.outcome, verdict.direction, round(verdict.ratio, 6)
('shown', 'less drift', 0.5)
>>> print(verdict.line)
atlas vs lora at target 1 (50% of lora's gain): less drift shown (ratio 0.5 [0.5, 0.5] over 5 seeds; drift 0.0119 vs 0.0238)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kinfolk.drift import Run
from kinfolk.drift.levels import GainLevel
from kinfolk.stats import HOLM_LEVEL, MIN_INTERVAL_UNITS, holm, one_sample_t_p, seeds_geometric_mean, t_interval
from kinfolk.verdict_words import NOT_REACHED, NOT_SHOWN, NOT_TESTED, SHOWN, judged, not_tested

LESS, MORE = "less drift", "more drift"  # the side a ratio falls on: below 1 favours the method
VALIDATION, TEST = "validation", "test"


@dataclass(frozen=True)
class Verdict:
    """`method` against `baseline` at one level; `ratio` below 1 favours `method`."""

    method: str
    baseline: str
    fraction: float
    level: float
    outcome: str  # one of `kinfolk.verdict_words.WORDS`
    seeds: list[str]
    ratio: float | None
    low: float | None  # the 95 % t-interval of the ratio (from MIN_INTERVAL_UNITS seeds)
    high: float | None
    drift: float | None  # geometric mean over seeds of the method's drift at the level
    baseline_drift: float | None
    line: str
    split: str = VALIDATION  # the split the drifts were read on
    p: float | None = None  # t-test of the log ratios (from 2 seeds)
    p_holm: float | None = None  # Holm-adjusted over a plan's primaries
    direction: str | None = None  # LESS or MORE: the side the ratio falls on (None without a ratio)


def verdicts(
    runs: Sequence[Run], baseline: str, levels: Sequence[GainLevel], test: Mapping[tuple[str, str], Run] | None = None
) -> list[Verdict]:
    """Every other method of `runs` (one chosen rate each) against `baseline`, level by level; `test` holds each
    run's test curve by (method, seed) when the verdicts read a test split."""
    methods = list(dict.fromkeys(run.method for run in runs if run.method != baseline))
    split = VALIDATION if test is None else TEST
    if levels and levels[0].reference <= levels[0].start:  # every level would sit at the untouched start
        why = f"no rate of {baseline} ever scored above the start {levels[0].start:.4g} with every seed"
        return [_unreached(m, baseline, level.fraction, level.start, why, split) for level in levels for m in methods]

    def drifts(method: str, level: float) -> dict[str, float | None]:
        chosen = [run for run in runs if run.method == method]
        if test is None:
            return {run.seed: run.drift_at(level).drift for run in chosen}
        steps = {
            run.seed: dict((step, drift) for step, _, drift in test[method, run.seed].checkpoints) for run in chosen
        }
        return {run.seed: run.drift_at(level, steps[run.seed]).drift for run in chosen}

    judged = []
    for level in levels:
        baseline_drifts = drifts(baseline, level.value)
        for method in methods:
            head = _head(method, baseline, level.fraction, level.value)
            unreached = [
                f"{run.name} {run.drift_at(level.value).how.removeprefix('not reached: ')}"
                for run in runs
                if run.method in (method, baseline) and run.drift_at(level.value).drift is None
            ]
            if unreached:
                judged.append(_unreached(method, baseline, level.fraction, level.value, "; ".join(unreached), split))
                continue
            judged.append(_verdict(head, method, baseline, level, drifts(method, level.value), baseline_drifts, split))
    return judged


def _verdict(
    head: str,
    method: str,
    baseline: str,
    level: GainLevel,
    ours: Mapping[str, float],
    theirs: Mapping[str, float],
    split: str,
) -> Verdict:
    seeds = sorted(set(ours) & set(theirs))
    drift, baseline_drift = seeds_geometric_mean(list(ours.values())), seeds_geometric_mean(list(theirs.values()))
    numbers = f"drift {_number(drift)} vs {_number(baseline_drift)}" + ("" if split == VALIDATION else " on test")
    if any(ours[seed] <= 0 or theirs[seed] <= 0 for seed in seeds):  # reached undrifted: no ratio
        line = f"{head}: {NOT_TESTED} (a seed reached the level with no drift, so there is no ratio; {numbers})"
        return Verdict(method, baseline, level.fraction, level.value, NOT_TESTED, seeds, None, None, None,
                       drift, baseline_drift, line, split)  # fmt: skip
    logs = np.log([ours[seed] / theirs[seed] for seed in seeds])
    ratio = math.exp(float(logs.mean()))
    direction = LESS if ratio < 1 else MORE
    p = one_sample_t_p(logs) if len(seeds) >= 2 else None
    if len(seeds) < MIN_INTERVAL_UNITS:
        outcome, low, high = NOT_TESTED, None, None
        line = f"{head}: {not_tested(len(seeds))}: ratio {ratio:.3g}, {numbers}"
    else:
        interval = t_interval(logs)
        low, high = math.exp(interval.low), math.exp(interval.high)
        outcome = judged((low, high), len(seeds))
        stated = f"ratio {ratio:.3g} [{low:.3g}, {high:.3g}] over {len(seeds)} seeds"
        said = f"{direction} {SHOWN} ({stated}" if outcome == SHOWN else f"{NOT_SHOWN} ({stated}, which holds 1"
        line = f"{head}: {said}; {numbers})"
    return Verdict(method, baseline, level.fraction, level.value, outcome, seeds, ratio, low, high, drift,
                   baseline_drift, line, split, p, direction=direction)  # fmt: skip


def holm_corrected(judged: Sequence[Verdict]) -> list[Verdict]:
    """The verdicts as a plan's primaries: Holm's correction over those with a p-value (`kinfolk.stats.holm`, the
    lab protocol's), each outcome "shown" (on its side: less or more drift) when its adjusted p is below `HOLM_LEVEL`,
    else "not shown"; a primary without a p-value (fewer than 2 seeds, no ratio, not reached) keeps its verdict.

    >>> from kinfolk.drift import Run
    >>> from kinfolk.drift.levels import gain_level
    >>> runs = [Run(m, str(s), "", [(0, 0.0, 0.0), (2, 2.0, 0.04 * r ** (m == "atlas") * (1 + s / 10))])
    ...         for m, r in (("lora", 1), ("atlas", 0.5)) for s in range(3)]
    >>> level = gain_level(0.5, [[run for run in runs if run.method == "lora"]])
    >>> (verdict,) = holm_corrected(verdicts(runs, "lora", [level]))
    >>> verdict.outcome, verdict.direction, verdict.p_holm
    ('shown', 'less drift', 0.0)
    """
    tested = [index for index, verdict in enumerate(judged) if verdict.p is not None]
    adjusted = dict(zip(tested, holm([judged[index].p for index in tested])))
    corrected = []
    for index, verdict in enumerate(judged):
        if index not in adjusted:
            corrected.append(verdict)
            continue
        p_holm = adjusted[index]
        outcome = SHOWN if p_holm < HOLM_LEVEL else NOT_SHOWN
        head = _head(verdict.method, verdict.baseline, verdict.fraction, verdict.level)
        stated = f"ratio {verdict.ratio:.3g} over {len(verdict.seeds)} seeds, Holm p {p_holm:.3g}"
        numbers = f"drift {_number(verdict.drift)} vs {_number(verdict.baseline_drift)} on {verdict.split}"
        said = f"{verdict.direction} {SHOWN}" if outcome == SHOWN else NOT_SHOWN
        line = f"{head}: {said} ({stated}; {numbers})"
        corrected.append(dataclasses.replace(verdict, outcome=outcome, p_holm=p_holm, line=line))
    return corrected


def _head(method: str, baseline: str, fraction: float, level: float) -> str:
    return f"{method} vs {baseline} at target {level:.4g} ({fraction:.0%} of {baseline}'s gain)"


def _unreached(method: str, baseline: str, fraction: float, level: float, why: str, split: str) -> Verdict:
    line = f"{_head(method, baseline, fraction, level)}: {NOT_REACHED} ({why})"
    return Verdict(method, baseline, fraction, level, NOT_REACHED, [], None, None, None, None, None, line, split)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
