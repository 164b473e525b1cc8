"""Every rule by which the lab's experiments choose on validation (or calibration), written once.

**Lowest drift at a gain level** (ATLAS: `atlas`, `atlas-controls`, `real-atlas` and its pilot, version 1's fronts),
the lab's **legacy** rule: it chose the committed results of the versions `LEGACY_LEVEL_RULE` pins, which keep
recomputing under it. `kinfolk compare`, `kinfolk drift` and any later version of these experiments use the one
matching rule instead (`kinfolk.drift.levels`: a run's drift read where it first reaches the level, interpolated,
the geometric mean over seeds, levels on one scale of the baseline's gain); the two can disagree on the same curves,
since this rule may take a later checkpoint that overshoots the level with less drift. tests/test_compare_levels.py
holds every ATLAS experiment's version to the table. A checkpoint carries its `step` (0: the untrained adapter), a score (`gain`, or the `target` accuracy) and its
retained `kl`, one value or one per retained source.

- a level (`gain_level`, `levels`) is frozen + fraction x (best - frozen), `best` the baseline's best score over its
  trained checkpoints (`best_score`), rounded to 10 decimals;
- a checkpoint reaches a level when its score is at least the level less `LEVEL_TOLERANCE` (1e-9), so a score equal
  to the level in exact arithmetic reaches it whatever the float error of frozen + fraction x (best - frozen);
- at a level, the chosen checkpoint is, among those reaching it, the one with the lowest drift (`lowest_at_level`);
  ties go to the one listed first: each experiment lists its runs in the order its plan names (`atlas` and the
  pilot: by run name; `atlas-controls`: by grid) and each run's checkpoints by step. None when none reaches;
- drift over several retained sources is the geometric mean of their KLs, each floored at 1e-12 (`drift`:
  `kinfolk.drift.levels.sources_drift`, the definition `kinfolk compare` uses too).

Checked on every committed record when this rule replaced four copies (each with its own tie-break, one with a
tolerance): no two reaching checkpoints ever tie on drift, so the tie-break decides no committed choice; the
tolerance decides one: `atlas` family 3, reverse, norm-matched at 0.5 of LoRA's gain, where the float level
0.8200000000000001 would shut out the checkpoint scoring 0.82 (version 2 had a tolerance of 1e-12 for it); the
rounding decides none, but `atlas-controls`' committed selections record two levels as 0.8200000000000001 (family 0,
reverse, high) that this rule records as 0.82. Version 1's fronts (`kinfolk.lab.methods.atlas.fronts.front`) keep
their strict comparison: their committed plot grid left out, in the very same case, a checkpoint this rule lets in.

>>> lora = [{"step": 0, "gain": 0.0, "kl": {"a": 1e-9}}, {"step": 12, "gain": 0.2, "kl": {"a": 0.01}},
...         {"step": 24, "gain": 0.4, "kl": {"a": 0.03}}]
>>> levels({"mid": 0.5, "high": 0.75}, lora)
{'mid': 0.2, 'high': 0.3}
>>> checkpoint_at(lora, 0.2), checkpoint_at(lora, 0.5)
(12, None)
>>> gain_level(0.5, best=1.0, frozen=0.64)  # 0.8200000000000001 before rounding
0.82

Every method's run (LoRA's too) is chosen in real-atlas's pilot by the same rule, `choose_run`: least drift at the
pilot's level (`pilot_level`), the same fraction of the best gain any LoRA run reaches.

**ADAPT** (every plan version: `adapt`, `adapt-controls`, `adapt-frontier`). A curve is `{order: [size, ...]}` with each size's depth
(`layers`), `validation` accuracy and `test` numbers (`accuracy`, `kl`); a routing record holds the calibration
split's accuracy and cost per level and size, the routed candidates' assignments and every fixed size's and
candidate's test accuracy and cost (`routing_record`).

- patch order (`chosen_orders`): per size k, the order with the higher validation accuracy; ties: back-to-front;
- routing threshold (`chosen_threshold`, versions 2-3): the candidate whose calibration accuracy minus that of the
  most accurate fixed size at no more calibration cost is largest; ties: the lower calibration cost;
- routing threshold against the random-mix frontier (`frontier_threshold`, version 4): the candidate whose calibration
  accuracy minus the frontier of random mixes of the fixed sizes at its calibration cost (`mix_frontier`) is
  largest; ties: the lower calibration cost, then the lower threshold. A choice at an end of the grid extends that
  end by one step, up to a bound, until it is interior; one still at an end is a grid edge.

Size is depth, not k: sizes of equal depth are not ordered against each other, and k = M (the variant itself, KL 0
by construction) is left out. `depth_concordance` is the share of pairs of sizes of different depth in which the
deeper one is better, value ties counting one half. With no trend the values are exchangeable across sizes, so each
such pair is better-deeper or better-shallower with equal probability whatever the ties: the null is 1/2 for every
design (`no_trend_concordance` checks it by enumeration). Kept in, k = M's KL of 0 is pinned at the best value
and the null moves up: to 2/3 for version 1's statistic over 6 sizes ordered by k, to 0.625 for depths
5, 5, 5, 6, 7, 8 or 5, 6, 7, 8, 8, 8.

>>> no_trend_concordance([5, 6, 7, 8, 8, 8], [0.3, 0.2, 0.1, 0.05, 0.01, 0.0], higher_is_better=False, pinned=5)
0.625

>>> depth_concordance([5, 6, 7, 8, 8], [0.5, 0.6, 0.6, 0.9, 0.8])
0.9444444444444444
>>> no_trend_concordance([5, 6, 7, 8, 8], [0.5, 0.6, 0.6, 0.9, 0.8])
0.5
>>> chosen_orders({"back-to-front": [{"validation": 0.5}], "front-to-back": [{"validation": 0.5}]})
['back-to-front']
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from kinfolk.drift.levels import sources_drift
from kinfolk.lab.methods.adapt.settings import ORDERS
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.plugins.adapt.hull import HullPoint, upper_hull

# The experiment versions whose committed results the lowest-drift rule chose (a later version uses
# `kinfolk.drift.levels`' rule and leaves this table).
LEGACY_LEVEL_RULE = {"atlas": "2-reanalysis", "atlas-controls": "3", "real-atlas": "1"}
LEVEL_DIGITS = 10  # a level is rounded to this many decimals
LEVEL_TOLERANCE = 1e-9  # a score this far below a level still reaches it (float error; above the rounding's 5e-11)

Checkpoint = Mapping[str, Any]  # {"step", a score ("gain" or "target"), "kl": {source: KL}} on one split
Candidate = TypeVar("Candidate")


def drift(point: Checkpoint, sources: Sequence[str] | None = None) -> float:
    """The geometric mean over `sources` (None: all the point's) of its KL(frozen || current), each floored."""
    return sources_drift(point["kl"].values() if sources is None else [point["kl"][source] for source in sources])


def best_score(points: Iterable[Checkpoint], score: str = "gain") -> float:
    """The best `score` over the trained checkpoints (step > 0)."""
    return max(point[score] for point in points if point["step"] > 0)


def gain_level(fraction: float, best: float, frozen: float = 0.0) -> float:
    """frozen + fraction x (best - frozen), rounded to `LEVEL_DIGITS` decimals."""
    return round(frozen + fraction * (best - frozen), LEVEL_DIGITS)


def levels(
    fractions: Mapping[str, float], baseline: Sequence[Checkpoint], score: str = "gain", frozen: float = 0.0
) -> dict[str, float]:
    """Each named level as a score: its fraction of the way from `frozen` to the baseline's best score."""
    best = best_score(baseline, score)
    return {name: gain_level(fraction, best, frozen) for name, fraction in fractions.items()}


def lowest_at_level(
    candidates: Iterable[Candidate],
    level: float,
    score: Callable[[Candidate], float],
    drift: Callable[[Candidate], float],
) -> Candidate | None:
    """The rule: among the candidates whose score reaches `level` (at least it, less `LEVEL_TOLERANCE`), the one with
    the lowest drift; ties: the first listed. None when none reaches.

    >>> lowest_at_level([(0.5, 3.0), (0.8, 2.0), (0.9, 2.0)], 0.6, score=lambda c: c[0], drift=lambda c: c[1])
    (0.8, 2.0)
    """
    reaching = [candidate for candidate in candidates if score(candidate) >= level - LEVEL_TOLERANCE]
    return min(reaching, key=drift, default=None)  # `min` keeps the first of equal keys


def lowest_drift(
    points: Iterable[Checkpoint], level: float, score: str = "gain", sources: Sequence[str] | None = None
) -> Checkpoint | None:
    """`lowest_at_level` over the trained checkpoints (step > 0), drift over `sources`."""
    trained = [point for point in points if point["step"] > 0]
    return lowest_at_level(trained, level, lambda p: p[score], lambda p: drift(p, sources))


def checkpoint_at(points: Sequence[Checkpoint], level: float) -> int | None:
    """The step of one run's lowest-drift trained checkpoint whose gain reaches `level` (None when none does)."""
    point = lowest_drift(points, level)
    return None if point is None else point["step"]


def checkpoints_at_levels(
    points: Mapping[str, Sequence[Checkpoint]], fractions: Mapping[str, float], baseline: str
) -> dict[str, Any]:
    """One run per method (`points`: its checkpoints on validation): the levels (`fractions` of the `baseline`
    method's best gain) and, per level and method, the step `checkpoint_at` chooses."""
    at = levels(fractions, points[baseline])
    chosen = {
        level: {method: checkpoint_at(ps, value) for method, ps in points.items()} for level, value in at.items()
    }
    return {"levels": at, "checkpoints": chosen}


def choose_run(runs: Mapping[str, Sequence[Checkpoint]], level: float) -> str:
    """Among a method's runs (by name), the one holding the lowest-drift checkpoint at `level` (runs listed by
    name); when none reaches the level, the one reaching the highest gain (ties: the first by name)."""
    names = sorted(runs)
    point = lowest_drift([{**p, "run": name} for name in names for p in runs[name]], level)
    if point is None:
        return max(names, key=lambda name: best_score(runs[name]))
    return point["run"]


def pilot_level(baseline_runs: Mapping[str, Sequence[Checkpoint]], fraction: float) -> float:
    """The pilot's comparison level: `fraction` of the best validation gain any of the baseline's runs reaches."""
    return gain_level(fraction, max(best_score(points) for points in baseline_runs.values()))


# `chosen_threshold`'s rule as every plan states it (a plan's hash covers this text).
ROUTING_THRESHOLD_RULE = (
    "the routed assignment (one per run of equivalent thresholds) whose calibration accuracy minus that of the most "
    "accurate fixed size at no more calibration cost is largest; ties: lower calibration cost"
)


def depth_concordance(depths: Sequence[int], values: Sequence[float], higher_is_better: bool = True) -> float | None:
    """Share of pairs of different depth whose deeper member has the better value (ties in value count 1/2)."""
    scores = []
    for (d1, v1), (d2, v2) in itertools.combinations(zip(depths, values), 2):
        if d1 == d2:
            continue
        shallow, deep = (v1, v2) if d1 < d2 else (v2, v1)
        better = deep > shallow if higher_is_better else deep < shallow
        scores.append(1.0 if better else 0.5 if deep == shallow else 0.0)
    return float(np.mean(scores)) if scores else None


def no_trend_concordance(
    depths: Sequence[int], values: Sequence[float], higher_is_better: bool = True, pinned: int | None = None
) -> float:
    """The expected `depth_concordance` with no trend: the mean over every assignment of the observed values to the
    sizes (values exchangeable), keeping the value at index `pinned` in place when it is fixed by construction."""
    free = [i for i in range(len(values)) if i != pinned]
    totals = []
    for order in itertools.permutations([values[i] for i in free]):
        shuffled = list(values)
        for index, value in zip(free, order):
            shuffled[index] = value
        totals.append(depth_concordance(depths, shuffled, higher_is_better))
    return float(round(np.mean(totals), 12))


def curve_sizes(curve: Mapping[str, Any], read_test=lambda size: size["test"]["mean"]) -> dict[str, list[dict]]:
    """An `AdaptFamily.curve`'s sizes per order, with the test numbers under `test` (`accuracy`, `kl`)."""
    return {
        order: [
            {"k": s["k"], "layers": s["layers"], "validation": s["validation"],
             "test": {"accuracy": read_test(s), "kl": s["kl"]}}
            for s in sizes
        ]
        for order, sizes in curve["orders"].items()
    }  # fmt: skip


def sizes_with_skills(curve: Mapping[str, Any], scored: Sequence[str]) -> dict[str, list[dict]]:
    """`curve_sizes` plus each size's test accuracy per scored skill (`test.skills`)."""
    sizes = curve_sizes(curve)
    for order, measured in curve["orders"].items():
        for size, raw in zip(sizes[order], measured):
            size["test"]["skills"] = {skill: raw["test"][skill] for skill in scored}
    return sizes


def chosen_orders(curve: Mapping[str, Any]) -> list[str]:
    """Per size k, the patch order with the higher validation accuracy (ties: back-to-front)."""
    sizes = len(curve[ORDERS[0]])
    return [max(ORDERS, key=lambda o, k=k: (curve[o][k]["validation"], o == ORDERS[0])) for k in range(sizes)]


def chosen_sizes(curve: Mapping[str, Any], orders: list[str]) -> list[dict[str, Any]]:
    """The sizes k < M in their chosen orders (k = M, the variant itself, left out)."""
    return [curve[order][k] for k, order in enumerate(orders)][:-1]


def routing_record(entry: Mapping[str, Any], policy: str) -> dict[str, Any]:
    """What selection and analysis read of one `route_outcomes` result: its calibration table, the `policy`'s
    candidates, and (under `test`) every fixed size's and candidate's test accuracy and cost."""
    candidates = entry["routed"][policy]
    return {
        "models": entry["models"],
        "levels": entry["levels"],
        "calibration": entry["calibration"],
        "candidates": [{"assignment": c["assignment"], "thresholds": c["thresholds"]} for c in candidates],
        "test": {
            "fixed": {m: {"accuracy": f["accuracy"], "cost": f["cost"]} for m, f in entry["fixed"].items()},
            "routed": [{"accuracy": c["accuracy"], "cost": c["cost"]} for c in candidates],
        },
    }


def chosen_threshold(routing: Mapping[str, Any]) -> int:
    """The index of the candidate with the largest calibration gain over the best fixed size at no more calibration
    cost (ties: lower calibration cost)."""
    calibration, models = routing["calibration"], list(routing["models"])
    accuracy = np.asarray([list(row) for row in calibration["accuracy"]])
    cost = np.asarray([list(row) for row in calibration["cost"]])
    levels = [str(level) for level in routing["levels"]]
    fixed = [(float(cost[:, j].mean()), float(accuracy[:, j].mean())) for j in range(len(models))]

    def score(index: int) -> tuple[float, float]:
        assignment = routing["candidates"][index]["assignment"]
        picks = [models.index(assignment[level]) for level in levels]
        routed_cost = float(np.mean([cost[i, j] for i, j in enumerate(picks)]))
        routed_accuracy = float(np.mean([accuracy[i, j] for i, j in enumerate(picks)]))
        affordable = [a for c, a in fixed if c <= routed_cost + 1e-9]
        gain = routed_accuracy - max(affordable) if affordable else -np.inf
        return gain, -routed_cost

    return max(range(len(routing["candidates"])), key=score)


def routed_gain(routing: Mapping[str, Any], index: int) -> EndpointValue:
    """Test accuracy of candidate `index` minus the most accurate fixed size whose test cost is no higher (None when
    every fixed size costs more); on a grid edge when its thresholds include 0 or 1."""
    test = routing["test"]
    routed = test["routed"][index]
    affordable = [f["accuracy"] for f in test["fixed"].values() if f["cost"] <= routed["cost"] + 1e-9]
    thresholds = routing["candidates"][index]["thresholds"]
    edge = 0.0 in thresholds or 1.0 in thresholds
    if not affordable:
        return EndpointValue(None, routed["accuracy"], None, edge)
    best = max(affordable)
    return EndpointValue(routed["accuracy"] - best, routed["accuracy"], best, edge)


# `frontier_threshold`'s rule as a plan states it (a plan's hash covers this text).
ROUTING_FRONTIER_RULE = (
    "per threshold of the calibration grid, the routed assignment whose calibration accuracy minus the random-mix "
    "frontier of the fixed sizes' calibration points at its calibration cost is largest; ties: lower calibration "
    "cost, then lower threshold; a choice at an end of the grid extends that end by one grid step, within the "
    "extension bound, until the choice is interior (one still at an end is flagged as a grid edge)"
)
THRESHOLD_TOLERANCE = 1e-9  # thresholds are rounded grid values: equal within this


def mix_frontier(points: Iterable[tuple[float, float]], cost: float) -> float | None:
    """The best accuracy random mixes of the fixed sizes (`points`: their (cost, accuracy)) reach at an expected
    cost of at most `cost`: the upper concave hull of the points (`kinfolk.plugins.adapt.hull`, the one `kinfolk
    route` reports) held flat right of its most accurate vertex; None below the cheapest size's cost, which no mix
    reaches. Wherever the hull rises (everywhere, when dearer sizes are more accurate) it is the hull itself.

    >>> sizes = [(1.0, 0.2), (2.0, 0.5), (3.0, 0.6), (4.0, 0.8), (5.0, 0.7)]  # (3, 0.6) lies under the hull
    >>> [round(mix_frontier(sizes, c), 3) for c in (1.0, 2.5, 3.0, 4.5, 6.0)], mix_frontier(sizes, 0.5)
    ([0.2, 0.575, 0.65, 0.8, 0.8], None)
    """
    hull = upper_hull(HullPoint(float(c), float(a)) for c, a in points)
    peak = max(hull.vertices, key=lambda vertex: vertex.accuracy)  # the cheapest of equally accurate vertices
    return hull.at(min(cost, peak.cost))


def threshold_grid(step: float, extension: int, ends: tuple[float, float] = (0.0, 1.0)) -> list[float]:
    """The thresholds a run routes at: the grid from `ends[0]` to `ends[1]` by `step` and `extension` steps beyond
    each end (the bound of `frontier_threshold`'s extension).

    >>> threshold_grid(0.25, 1)
    [-0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 1.25]
    """
    count = round((ends[1] - ends[0]) / step)
    return [round(ends[0] + i * step, 10) for i in range(-extension, count + extension + 1)]


def _calibration_table(routing: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(accuracy, cost: levels x models; share: per level) of the routing record's calibration split."""
    calibration = routing["calibration"]
    accuracy, cost = (np.asarray([list(row) for row in calibration[key]]) for key in ("accuracy", "cost"))
    return accuracy, cost, np.asarray(list(calibration["share"]))


def frontier_threshold(
    routing: Mapping[str, Any], step: float, extension: int, ends: tuple[float, float] = (0.0, 1.0)
) -> dict[str, Any]:
    """The routed candidate chosen on the calibration split (`ROUTING_FRONTIER_RULE`): its `index`, the `grid`
    [low, high] it was chosen on (the initial `ends`, extended one `step` at a time while the choice lay at an end,
    at most `extension` steps) and whether it is still at an end (`edge`). The record's candidates must have been
    routed at `threshold_grid(step, extension, ends)`."""
    accuracy, cost, share = _calibration_table(routing)
    models, levels = list(routing["models"]), [str(level) for level in routing["levels"]]
    fixed = [(float(share @ cost[:, j]), float(share @ accuracy[:, j])) for j in range(len(models))]
    candidates = routing["candidates"]

    def score(index: int) -> tuple[float, float]:
        assignment = candidates[index]["assignment"]
        picks = [models.index(assignment[level]) for level in levels]
        routed_cost = float(sum(s * cost[i, j] for i, (s, j) in enumerate(zip(share, picks))))
        routed_accuracy = float(sum(s * accuracy[i, j] for i, (s, j) in enumerate(zip(share, picks))))
        frontier = mix_frontier(fixed, routed_cost)
        return (-np.inf if frontier is None else routed_accuracy - frontier), -routed_cost

    scores = [score(index) for index in range(len(candidates))]
    low, high = ends
    bound = (ends[0] - extension * step - THRESHOLD_TOLERANCE, ends[1] + extension * step + THRESHOLD_TOLERANCE)
    while True:
        within = [i for i, c in enumerate(candidates)
                  if any(low - THRESHOLD_TOLERANCE <= t <= high + THRESHOLD_TOLERANCE for t in c["thresholds"])]  # fmt: skip
        chosen = max(within, key=scores.__getitem__)  # candidates are listed by threshold: ties go to the lower
        at = [
            any(abs(t - end) <= THRESHOLD_TOLERANCE for t in candidates[chosen]["thresholds"]) for end in (low, high)
        ]
        extend_low, extend_high = at[0] and low - step >= bound[0], at[1] and high + step <= bound[1]
        if not (extend_low or extend_high):
            return {"index": chosen, "grid": [low, high], "edge": at[0] or at[1]}
        low, high = round(low - step * extend_low, 10), round(high + step * extend_high, 10)


def routed_over_frontier(routing: Mapping[str, Any], chosen: Mapping[str, Any]) -> EndpointValue:
    """Test accuracy of the chosen candidate (`frontier_threshold`) minus the random-mix frontier of the fixed sizes'
    test points at its test cost (None below the cheapest size's cost), flagged when the choice is a grid edge."""
    test = routing["test"]
    routed = test["routed"][chosen["index"]]
    frontier = mix_frontier([(f["cost"], f["accuracy"]) for f in test["fixed"].values()], routed["cost"])
    value = None if frontier is None else routed["accuracy"] - frontier
    return EndpointValue(value, routed["accuracy"], frontier, chosen["edge"])
