"""One line per method and level: does the method drift less than the baseline on first reaching that target?

The levels are `kinfolk.drift.levels.GainLevel`s, fractions of the baseline's gain on the one scale the rate choice
uses too (`kinfolk.compare.analysis` makes them). At each level the runs of a method and of the baseline (their chosen rates) are compared by
`kinfolk.drift.target_matched` at that one level: per seed, ratio = drift(method) / drift(baseline), each read off
its run's envelope; over seeds, their geometric mean and, from `kinfolk.stats.MIN_INTERVAL_UNITS` (5) paired
seeds on, the exponentiated 95 % t-interval of the log ratios. The verdict uses kinfolk's four words
(`kinfolk.verdict_words`, defined in docs/compare.md): "less drift shown" or "more drift shown" when that interval
excludes 1, "not shown" when it holds 1, "not tested (n seeds; an interval needs 5)" when there are too few seeds
for one (the ratio is then a measurement, not a finding), and "not reached" when a run would reach the level only
by extrapolation.

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

from collections.abc import Sequence
from dataclasses import dataclass

from kinfolk.drift import Run, target_matched
from kinfolk.drift.levels import GainLevel, seeds_drift
from kinfolk.verdict_words import NOT_REACHED, NOT_TESTED, SHOWN, judged, not_tested

LESS, MORE = "less drift", "more drift"  # the side a ratio falls on: below 1 favours the method


@dataclass(frozen=True)
class Verdict:
    """`method` against `baseline` at one level; `ratio` below 1 favours `method`."""

    method: str
    baseline: str
    fraction: float
    level: float
    outcome: str  # one of `kinfolk.verdict_words.WORDS`
    direction: str | None  # LESS or MORE: the side the ratio falls on (None when not reached)
    seeds: list[str]
    ratio: float | None
    low: float | None  # the 95 % t-interval of the ratio (from MIN_INTERVAL_UNITS seeds)
    high: float | None
    drift: float | None  # geometric mean over seeds of the method's drift at the level
    baseline_drift: float | None
    line: str


def verdicts(runs: Sequence[Run], baseline: str, levels: Sequence[GainLevel]) -> list[Verdict]:
    """Every other method of `runs` (one chosen rate each) against `baseline`, level by level."""
    methods = list(dict.fromkeys(run.method for run in runs if run.method != baseline))
    baseline_runs = [run for run in runs if run.method == baseline]
    if levels and levels[0].reference <= levels[0].start:  # every level would sit at the untouched start
        why = f"no rate of {baseline} ever scored above the start {levels[0].start:.4g} with every seed"
        return [
            _unreached(method, baseline, level.fraction, level.start, why) for level in levels for method in methods
        ]
    return [
        _verdict(method, baseline, level.fraction, level.value, [r for r in runs if r.method == method], baseline_runs)
        for level in levels
        for method in methods
    ]


def _verdict(
    method: str, baseline: str, fraction: float, level: float, method_runs: list[Run], baseline_runs: list[Run]
) -> Verdict:
    head = _head(method, baseline, fraction, level)
    unreached = [(run.name, run.drift_at(level).how) for run in (*method_runs, *baseline_runs)]
    unreached = [(name, how) for name, how in unreached if how.startswith("not reached")]
    if unreached:
        why = "; ".join(f"{name} {how.removeprefix('not reached: ')}" for name, how in unreached)
        return _unreached(method, baseline, fraction, level, why)
    matched = target_matched([*method_runs, *baseline_runs], method, requirements=[level])
    comparison = matched.comparisons[0]
    drift, baseline_drift = seeds_drift(method_runs, level), seeds_drift(baseline_runs, level)
    seeds, ratio, interval = comparison.seeds, comparison.ratio, comparison.interval
    numbers = f"drift {_number(drift)} vs {_number(baseline_drift)}"
    low, high = (None, None) if interval is None else (interval.low, interval.high)
    outcome = judged(None if interval is None else (low, high), len(seeds))
    direction = LESS if ratio < 1 else MORE
    stated = f"ratio {ratio:.3g} [{low:.3g}, {high:.3g}] over {len(seeds)} seeds" if interval else ""
    if outcome == NOT_TESTED:
        line = f"{head}: {not_tested(len(seeds))}: ratio {ratio:.3g}, {numbers}"
    elif outcome == SHOWN:
        line = f"{head}: {direction} {SHOWN} ({stated}; {numbers})"
    else:
        line = f"{head}: {outcome} ({stated}, which holds 1; {numbers})"
    return Verdict(
        method, baseline, fraction, level, outcome, direction, seeds, ratio, low, high, drift, baseline_drift, line
    )


def _head(method: str, baseline: str, fraction: float, level: float) -> str:
    return f"{method} vs {baseline} at target {level:.4g} ({fraction:.0%} of {baseline}'s gain)"


def _unreached(method: str, baseline: str, fraction: float, level: float, why: str) -> Verdict:
    line = f"{_head(method, baseline, fraction, level)}: {NOT_REACHED} ({why})"
    return Verdict(method, baseline, fraction, level, NOT_REACHED, None, [], None, None, None, None, None, line)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
