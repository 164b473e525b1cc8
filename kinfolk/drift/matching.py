"""Matched-gain comparison: each run's drift at equal target scores, read off its own curve, compared across methods.

A run (one method, one seed) is its checkpoints, (step, target score, drift) in step order. Its drift at a target
*level* k is read off its **running-maximum envelope**, by interpolation, never by choosing a checkpoint:

1. the envelope keeps the checkpoints whose target exceeds every earlier one (the records), so along it the target
   rises strictly and "the drift when the run first reached k" is a function of k;
2. a level equal to a record's target takes that record's drift; a level between two consecutive records
   (t_a, d_a) and (t_b, d_b) takes their **geometric** interpolation, log d = (1 − f)·log d_a + f·log d_b with
   f = (k − t_a) / (t_b − t_a). From the untouched start (step 0), or from a d_a of 0, the segment is linear in
   drift instead, d = d_a + f·(d_b − d_a): the geometric one would read 0 all the way to t_b, or, from the start's
   float noise (a measured KL of 2e-17 where it is 0 in exact arithmetic), drifts orders of magnitude too small.
   Both are monotone between their two records;
3. a level below the first record's target or above the last one's is **not reached**: the run would only reach
   it by extrapolation, and it is reported as such, never filled in.

Why geometric: drift grows by orders of magnitude over a run and is convex in the target (the last points of gain
cost the most), so a straight chord between two sparse saves overstates the drift between them and the run saved
less often looks worse, the very dependence on save spacing this replaces; a geometric chord is exact for drift
growing exponentially in the target, and errs by less than the linear one for convex power laws (d ∝ t⁴: −21 %
against +68 % at a segment's middle). It also matches the ratios' geometric summaries.

A run's mean drift averages its drift over the levels; per seed, ratio = mean drift(method) / mean drift(comparator);
over seeds the log ratios get their mean and, from `kinfolk.stats.MIN_INTERVAL_UNITS` (5) paired seeds on, the lab
protocol's t-interval (n − 1 degrees of freedom), exponentiated, with a percentile bootstrap over seeds as its
cross-check. With fewer seeds the per-seed ratios are the report, never a 95 % interval (docs/protocol.md).

>>> run = Run("lora", "1", "runs/lora-1", [(0, 2.0, 0.0), (2, 4.0, 0.01), (4, 3.0, 0.02), (6, 8.0, 0.04)])
>>> [point[0] for point in run.envelope()]  # step 4 scored below step 2's best: not on the envelope
[0, 2, 6]
>>> value = run.drift_at(6.0)  # halfway from 4 to 8: √(0.01 · 0.04)
>>> round(value.drift, 6), value.how
(0.02, 'interpolated')
>>> run.drift_at(3.0).drift, run.drift_at(9.0).how  # linear from the untouched start; beyond the best score
(0.005, 'not reached: above its best score 8')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

from kinfolk.errors import InputError, did_you_mean, option_name
from kinfolk.hints import suggest
from kinfolk.stats import (
    MIN_INTERVAL_UNITS,
    Interval,
    geometric_mean,
    geometric_mean_interval,
    seeds_geometric_mean,
    t_interval,
)

START_STEP = 0  # the untouched model, which `RetainedKLCallback(measure_at_start=True)` measures (drift 0)
CONTINUOUS_LEVELS = 11  # default levels of a non-count target: evenly spaced over the shared range, ends included
INTERPOLATION = (
    "drift at a target level is read off each run's running-maximum envelope of the target (the checkpoints scoring "
    "above every earlier one), interpolated geometrically in drift (linearly from the untouched start or a zero drift) between the two "
    "records around the level; a level outside a run's envelope is not reached, never extrapolated"
)
Checkpoint = tuple[int, float, float]  # (step, target score, drift)
REQUIREMENTS_HINT = suggest("--requirements", "drift")


@dataclass(frozen=True)
class LevelValue:
    """A run's drift at one level: `how` is 'checkpoint', 'interpolated' or 'not reached: <why>' (drift None)."""

    drift: float | None
    how: str


@dataclass
class Run:
    """One training run's checkpoints as (step, target score, drift), in any order."""

    method: str
    seed: str
    path: str
    checkpoints: list[Checkpoint] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.method}/{self.seed}"

    def envelope(self) -> list[Checkpoint]:
        """The records: checkpoints, in step order, whose target exceeds every earlier checkpoint's."""
        records: list[Checkpoint] = []
        for point in sorted(self.checkpoints):
            if not records or point[1] > records[-1][1]:
                records.append(point)
        return records

    def trained_targets(self) -> list[float]:
        """Target scores of the checkpoints after training began (the untouched start left out)."""
        return [target for step, target, _ in self.checkpoints if step != START_STEP]

    def drift_at(self, level: float, drifts: Mapping[int, float] | None = None) -> LevelValue:
        """The drift when this run first reached `level`, interpolated along its envelope (see the module). With
        `drifts` (step -> drift, measured at the same checkpoints on other rows: a test split), the point is found on
        this run's own target and the drift read there is theirs, interpolated between the same two checkpoints."""
        records = self.envelope()
        if drifts is not None:
            records = [(step, target, drifts[step]) for step, target, _ in records]
        if level < records[0][1]:
            return LevelValue(None, f"not reached: below its first measured score {records[0][1]:g}")
        if level > records[-1][1]:
            return LevelValue(None, f"not reached: above its best score {records[-1][1]:g}")
        for (low_step, low_target, low_drift), (_, high_target, high_drift) in pairwise(records):
            if low_target < level < high_target:
                fraction = (level - low_target) / (high_target - low_target)
                linear = low_step == START_STEP or low_drift <= 0 or high_drift <= 0
                return LevelValue(_between(low_drift, high_drift, fraction, linear), "interpolated")
        return LevelValue(next(drift for _, target, drift in records if target == level), "checkpoint")

    @classmethod
    def from_steps(
        cls, method: str, seed: str, path: str, rows: Mapping[int, Mapping[str, Any]], target: str, kl: str
    ) -> Run:
        """A run from drift-log rows merged per step: the steps that carry both the target and the KL."""
        checkpoints = [
            (step, _number(row, target, path, step), _number(row, kl, path, step))
            for step, row in rows.items()
            if target in row and kl in row
        ]
        if not checkpoints:
            raise InputError(f"run {method}/{seed} ({path}) {_missing_keys(rows, target, kl)}")
        return cls(method, str(seed), str(path), checkpoints)


def _missing_keys(rows: Mapping[int, Mapping[str, Any]], target: str, kl: str) -> str:
    """Why no step carries both keys: the key (the user's own spelling) that no row carries, with the nearest key
    the rows do carry and every one they carry; or that the two never share a step."""
    keys = sorted({key for row in rows.values() for key in row} - {"step"})
    for key, option in ((target, "target"), (kl, "kl")):
        if key not in keys:
            hint = did_you_mean(key, keys, quote=True)
            return f"has no {option_name(option)} key {key!r} in any row (its rows carry {keys}){hint}"
    return f"has no step with both {target!r} and {kl!r} (they are logged at different steps)"


def _between(low: float, high: float, fraction: float, linear: bool) -> float:
    if linear:
        return low + fraction * (high - low)
    return math.exp((1 - fraction) * math.log(low) + fraction * math.log(high))


def _number(row: Mapping[str, Any], key: str, path: str, step: int) -> float:
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{path}: step {step} has {key}={value!r}, not a finite number")
    return float(value)


def shared_requirements(runs: Sequence[Run]) -> list[float]:
    """Default levels: the range every run's envelope covers after training began, from the highest of the runs'
    first trained records to the lowest of their best scores (the untouched start, step 0, never sets it). Every
    integer in it when the scores are counts, else `CONTINUOUS_LEVELS` evenly spaced levels (not the observed
    scores, which would depend on when checkpoints were saved)."""
    for run in runs:
        if not any(step != START_STEP for step, _, _ in run.envelope()):
            start = run.envelope()[0][1]
            raise InputError(
                f"run {run.name} has no checkpoint after step {START_STEP} scoring above its start ({start:g}); "
                "nothing to match"
            )
    lows = {run.name: _first_trained_record(run) for run in runs}
    highs = {run.name: run.envelope()[-1][1] for run in runs}
    low, high = max(lows.values()), min(highs.values())
    if low > high:
        ranges = ", ".join(f"{name}: [{lows[name]:g}, {highs[name]:g}]" for name in lows)
        raise InputError(f"the runs' target scores share no range ({ranges}); pass {REQUIREMENTS_HINT}")
    scores = [target for run in runs for target in run.trained_targets()]
    if all(float(score).is_integer() for score in scores):
        return [float(k) for k in range(math.ceil(low), math.floor(high) + 1)]
    return [round(float(k), 12) for k in np.unique(np.linspace(low, high, CONTINUOUS_LEVELS))]  # no 0.9199999


def _first_trained_record(run: Run) -> float:
    return next(target for step, target, _ in run.envelope() if step != START_STEP)


def parse_requirements(text: str) -> list[float]:
    """ "148:160" (inclusive integer range), "-3:-1", or "0.4,0.45,0.5" (any signs)."""
    try:
        parts = [float(part) for part in text.split(":" if ":" in text else ",")]
    except ValueError:
        raise InputError(f"--requirements takes low:high or a list of scores such as 0.4,0.5; got {text!r}") from None
    if ":" in text:
        start, end = parts if len(parts) == 2 else (math.nan, math.nan)
        if not (start.is_integer() and end.is_integer()) or end < start:
            raise InputError(f"a range needs integers low:high, got {text!r}")
        return [float(k) for k in range(int(start), int(end) + 1)]
    if not all(math.isfinite(part) for part in parts):
        raise InputError(f"--requirements takes finite scores, got {text!r}")
    return sorted(set(parts))


@dataclass
class RunResult:
    method: str
    seed: str
    path: str
    checkpoints: list[Checkpoint]
    envelope: list[Checkpoint]
    drift_by_requirement: list[float]
    how_by_requirement: list[str]
    mean_drift: float


@dataclass
class MethodSummary:
    method: str
    seeds: list[str]
    mean_drift: float  # geometric mean over seeds of the runs' mean drifts
    drift_by_requirement: list[float | None]  # over seeds, `kinfolk.drift.levels`' rule (0 where a seed's is 0)


@dataclass
class Comparison:
    """`method` against one comparator over their shared seeds; ratios below 1 favour `method`."""

    comparator: str
    seeds: list[str]
    ratio_by_seed: dict[str, float]
    ratio: float | None  # geometric mean of the per-seed ratios
    interval: Interval | None  # exp of the t-interval of the log ratios, from MIN_INTERVAL_UNITS seeds
    bootstrap: Interval | None  # the cross-check: percentile bootstrap of the geometric mean over seeds
    ratio_by_requirement: list[float | None]  # None where a seed's drift is 0 at that level
    note: str = ""


@dataclass
class Unreached:
    requirement: float
    runs: dict[str, str]  # run name -> why it is not reached


@dataclass
class MatchedGain:
    """The whole comparison; `as_dict()` is what report.json holds."""

    method: str
    target: str
    kl: str
    interpolation: str
    requirements: list[float]
    unreached: list[Unreached]
    flags: list[str]
    runs: list[RunResult]
    methods: list[MethodSummary]
    comparisons: list[Comparison]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def target_matched(
    runs: Sequence[Run],
    method: str,
    requirements: Sequence[float] | None = None,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    target: str = "target",
    kl: str = "retained_kl",
) -> MatchedGain:
    """Compare `method` with every other method at matched target levels (default: `shared_requirements`)."""
    methods = sorted({run.method for run in runs}, key=lambda name: (name != method, name))
    if method not in methods:
        raise InputError(f"method {method!r} has no runs; methods present: {methods}")
    by_key: dict[tuple[str, str], Run] = {}
    for run in runs:
        if (run.method, run.seed) in by_key:
            raise InputError(
                f"two runs share method {run.method!r} and seed {run.seed!r}: {by_key[run.method, run.seed].path} "
                f"and {run.path}"
            )
        by_key[run.method, run.seed] = run
    asked = list(requirements) if requirements is not None else shared_requirements(runs)
    values = {key: [run.drift_at(k) for k in asked] for key, run in by_key.items()}
    unreached = [
        Unreached(k, {by_key[key].name: row[i].how for key, row in values.items() if row[i].drift is None})
        for i, k in enumerate(asked)
    ]
    unreached = [entry for entry in unreached if entry.runs]
    kept = [i for i, k in enumerate(asked) if k not in {entry.requirement for entry in unreached}]
    if not kept:
        raise InputError(f"no requirement is reached by every run: {_describe(unreached[0])}")
    drift = {key: [row[i].drift for i in kept] for key, row in values.items()}
    mean = {key: float(np.mean(row)) for key, row in drift.items()}
    for key, value in mean.items():
        if value <= 0:
            raise InputError(
                f"run {key[0]}/{key[1]} has zero drift at every requirement (its untouched start, or a frozen "
                "checkpoint); raise the lowest requirement"
            )

    def seeds_of(name: str) -> list[str]:
        return sorted(seed_ for method_, seed_ in by_key if method_ == name)

    summaries = [
        MethodSummary(
            name,
            seeds_of(name),
            geometric_mean([mean[name, s] for s in seeds_of(name)]),
            [seeds_geometric_mean([drift[name, s][i] for s in seeds_of(name)]) for i in range(len(kept))],
        )
        for name in methods
    ]
    comparisons = [
        _compare(
            method,
            name,
            sorted(set(seeds_of(method)) & set(seeds_of(name))),
            mean,
            drift,
            n_resamples,
            confidence,
            seed,
        )
        for name in methods[1:]
    ]
    flags = [
        f"run {run.name}: its target never moved ({run.trained_targets()[0]:g} at every trained checkpoint), so its "
        "drift is not matched to reaching a score"
        for run in runs
        if len(set(run.trained_targets())) == 1
    ]
    results = [
        RunResult(
            run.method,
            run.seed,
            run.path,
            sorted(run.checkpoints),
            run.envelope(),
            drift[run.method, run.seed],
            [values[run.method, run.seed][i].how for i in kept],
            mean[run.method, run.seed],
        )
        for run in runs
    ]
    return MatchedGain(
        method, target, kl, INTERPOLATION, [asked[i] for i in kept], unreached, flags, results, summaries, comparisons
    )


def _compare(
    method: str,
    name: str,
    seeds: list[str],
    mean: dict[tuple[str, str], float],
    drift: dict[tuple[str, str], list[float]],
    n_resamples: int,
    confidence: float,
    seed: int,
) -> Comparison:
    if not seeds:
        return Comparison(name, [], {}, None, None, None, [], note=f"no seed shared with {method}")
    ratios = [mean[method, s] / mean[name, s] for s in seeds]
    interval = bootstrap = None
    if len(seeds) >= MIN_INTERVAL_UNITS:
        logs = t_interval(np.log(ratios), confidence=confidence)
        interval = Interval(math.exp(logs.estimate), math.exp(logs.low), math.exp(logs.high), confidence)
        bootstrap = geometric_mean_interval(ratios, n_resamples=n_resamples, confidence=confidence, seed=seed)
    by_level = [
        _positive_geometric_mean([_ratio(drift[method, s][i], drift[name, s][i]) for s in seeds])
        for i in range(len(drift[method, seeds[0]]))
    ]
    return Comparison(name, seeds, dict(zip(seeds, ratios)), geometric_mean(ratios), interval, bootstrap, by_level)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if numerator > 0 and denominator > 0 else None


def _positive_geometric_mean(values: list[float | None]) -> float | None:
    """The geometric mean, or None when a value is missing or zero (a drift of 0 has no log)."""
    return geometric_mean(values) if all(value is not None and value > 0 for value in values) else None


def _describe(entry: Unreached) -> str:
    return f"{entry.requirement:g} is " + "; ".join(f"{name} {why}" for name, why in entry.runs.items())
