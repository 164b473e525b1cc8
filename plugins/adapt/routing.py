"""Adaptive model-size selection (ADAPT §4.4): send each difficulty level to the smallest model of a family that is
accurate enough there, chosen on a calibration split and measured on a test split against every fixed size.

The inputs are `Outcomes`, one per split: each example's difficulty level and, per model, whether the model answered
it correctly (a score in [0, 1]) and what answering cost (tokens × the model's cost per token,
`kinfolk.plugins.adapt.cost`). A policy maps every level to one model, from the calibration split's `LevelTable`:

- `minimum`: per level, the cheapest model whose accuracy on that level clears the threshold (the most accurate one
  where none does): every level individually at the threshold;
- `average`: the cheapest assignment whose example-weighted accuracy over the levels clears the threshold, so harder
  levels may undershoot it (exhaustive search over each level's non-dominated models; the most accurate assignment
  where none clears it).

`frontier` sweeps the threshold and measures every routed policy on the test split — accuracy, the minimum accuracy
over levels and mean cost per example, from the test outcomes of the model each example is routed to — beside every
fixed model's point, and says per fixed model whether routing beats it (`dominance`). Every point also carries the
random-mix baseline at its cost (`hull_accuracy`: the best accuracy a random mix of two fixed models reaches at that
expected cost, `kinfolk.plugins.adapt.hull`) and its accuracy minus it (`gain_over_hull`). The curve is measured: no
accuracy is carried over from calibration.

>>> calibration = Outcomes(("small", "large"), levels=[1, 1, 2, 2],
...                        correct=[[1, 1], [1, 1], [0, 1], [1, 1]], cost=[[1, 4]] * 4)
>>> table = calibration.by_level()
>>> table.accuracy.tolist()  # levels × models
[[1.0, 1.0], [0.5, 1.0]]
>>> route_minimum(table, 0.9), route_average(table, 0.7)
({1: 'small', 2: 'large'}, {1: 'small', 2: 'small'})
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kinfolk.errors import InputError
from kinfolk.figures import pyplot, save_figure
from kinfolk.plugins.adapt.hull import Hull, HullPoint, upper_hull

POLICIES = ("average", "minimum")
METRIC_OF_POLICY = {"average": "accuracy", "minimum": "minimum_accuracy"}  # what each policy keeps at the threshold
MAX_ASSIGNMENTS = 5_000_000  # the average policy's exhaustive search refuses larger spaces
THRESHOLD_QUANTILES = 101  # thresholds read off the calibration table's own values: every value of up to 101


@dataclass(frozen=True)
class ScoreScale:
    """How the outcomes' score is shown. Routing keeps what clears a threshold, so it works on a score where higher
    is better: a loss is routed on its negation (`sign` -1) and shown, and its thresholds read, as the loss again."""

    name: str
    sign: int = 1

    def shown(self, value: float | None) -> float | None:
        return None if value is None else self.sign * value


SCORE_SCALES = {"correct": ScoreScale("accuracy"), "loss": ScoreScale("loss per token", sign=-1)}


@dataclass(frozen=True)
class LevelTable:
    """Per difficulty level (rows) and model (columns): accuracy and mean cost per example; `share` is each level's
    share of the split's examples."""

    levels: tuple
    models: tuple[str, ...]
    accuracy: np.ndarray
    cost: np.ndarray
    share: np.ndarray


@dataclass(frozen=True)
class Outcomes:
    """One split: `levels[i]` is example i's difficulty, `correct[i, m]` model m's score on it, `cost[i, m]` its cost."""

    models: tuple[str, ...]
    levels: Sequence
    correct: Any
    cost: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "levels", np.asarray(self.levels))
        for name in ("correct", "cost"):
            values = np.asarray(getattr(self, name), dtype=np.float64)
            if values.shape != (len(self.levels), len(self.models)):
                raise InputError(
                    f"outcomes: {name} has shape {values.shape}, expected (examples, models) = "
                    f"({len(self.levels)}, {len(self.models)})"
                )
            if not np.isfinite(values).all():
                raise InputError(f"outcomes: {name} has missing or infinite values")
            object.__setattr__(self, name, values)
        if not len(self.levels) or not self.models:
            raise InputError("outcomes: no examples or no models")
        if len(set(self.models)) != len(self.models):
            raise InputError(f"outcomes: a model is named twice in {list(self.models)}")

    def by_level(self) -> LevelTable:
        levels = tuple(sorted(set(self.levels.tolist())))
        rows = [self.levels == level for level in levels]
        return LevelTable(
            levels=levels,
            models=self.models,
            accuracy=np.stack([self.correct[row].mean(axis=0) for row in rows]),
            cost=np.stack([self.cost[row].mean(axis=0) for row in rows]),
            share=np.asarray([row.mean() for row in rows]),
        )

    def model_index(self, name: str) -> int:
        if name not in self.models:
            raise InputError(f"outcomes: no model {name!r} (models: {list(self.models)})")
        return self.models.index(name)


def _cheapest_first(table: LevelTable, level: int, candidates: Sequence[int]) -> int:
    """The cheapest candidate on `level`, the more accurate one on equal cost."""
    return min(candidates, key=lambda m: (table.cost[level, m], -table.accuracy[level, m], m))


def route_minimum(table: LevelTable, threshold: float) -> dict[Any, str]:
    """Each level to its cheapest model at or above `threshold` there (its most accurate model where none is)."""
    assignment = {}
    for index, level in enumerate(table.levels):
        clear = [m for m in range(len(table.models)) if table.accuracy[index, m] >= threshold]
        if not clear:
            best = table.accuracy[index].max()
            clear = [m for m in range(len(table.models)) if table.accuracy[index, m] == best]
        assignment[level] = table.models[_cheapest_first(table, index, clear)]
    return assignment


def _non_dominated(table: LevelTable, level: int) -> list[int]:
    """The models of `level` that no other model beats (at most the cost and at least the accuracy, one strictly)."""
    accuracy, cost = table.accuracy[level], table.cost[level]
    kept = []
    for m in range(len(table.models)):
        beaten = any(
            cost[o] <= cost[m] and accuracy[o] >= accuracy[m] and (cost[o] < cost[m] or accuracy[o] > accuracy[m])
            for o in range(len(table.models))
        )
        duplicate = any(cost[o] == cost[m] and accuracy[o] == accuracy[m] for o in kept)
        if not beaten and not duplicate:
            kept.append(m)
    return kept


def route_average(table: LevelTable, threshold: float) -> dict[Any, str]:
    """The cheapest level → model assignment whose share-weighted accuracy is at least `threshold` (the most
    accurate assignment, then the cheapest of those, where none is)."""
    options = [_non_dominated(table, level) for level in range(len(table.levels))]
    size = int(np.prod([len(o) for o in options], dtype=np.float64))
    if size > MAX_ASSIGNMENTS:
        raise InputError(
            f"the average policy would search {size} assignments (> {MAX_ASSIGNMENTS}); use fewer levels or models"
        )
    accuracy = np.zeros(())
    cost = np.zeros(())
    for level, choice in enumerate(options):  # broadcast one axis per level: every assignment at once
        shape = [1] * len(options)
        shape[level] = len(choice)
        accuracy = accuracy + table.share[level] * table.accuracy[level, choice].reshape(shape)
        cost = cost + table.share[level] * table.cost[level, choice].reshape(shape)
    accuracy, cost = accuracy.ravel(), cost.ravel()
    feasible = accuracy >= threshold - 1e-12
    if feasible.any():
        order = np.lexsort((-accuracy, np.where(feasible, cost, np.inf)))  # cheapest feasible, then most accurate
    else:
        order = np.lexsort((cost, -accuracy))  # most accurate, then cheapest
    chosen = np.unravel_index(int(order[0]), [len(choice) for choice in options])
    return {level: table.models[choice[i]] for level, choice, i in zip(table.levels, options, chosen)}


ROUTERS: dict[str, Callable[[LevelTable, float], dict[Any, str]]] = {
    "average": route_average,
    "minimum": route_minimum,
}


def measure(outcomes: Outcomes, model_of_level: Callable[[Any], str]) -> dict[str, Any]:
    """Accuracy, minimum accuracy over levels and mean cost per example when example i goes to
    `model_of_level(levels[i])`, read from the split's own outcomes."""
    chosen = np.asarray([outcomes.model_index(model_of_level(level)) for level in outcomes.levels.tolist()])
    rows = np.arange(len(chosen))
    correct, cost = outcomes.correct[rows, chosen], outcomes.cost[rows, chosen]
    per_level = {}
    for level in sorted(set(outcomes.levels.tolist())):
        mask = outcomes.levels == level
        per_level[level] = {"accuracy": float(correct[mask].mean()), "examples": int(mask.sum())}
    return {
        "accuracy": float(correct.mean()),
        "minimum_accuracy": min(entry["accuracy"] for entry in per_level.values()),
        "cost": float(cost.mean()),
        "per_level": per_level,
    }


def _dominance(points: list[dict[str, Any]], fixed: dict[str, Any], metric: str) -> dict[str, Any]:
    """Does a routed point beat this fixed model: at most its cost and at least its `metric`, one of them strictly?
    Also the best routed `metric` gain within its cost and the cost saved at its `metric`."""
    within = [p for p in points if p["cost"] <= fixed["cost"]]
    as_good = [p for p in points if p[metric] >= fixed[metric]]
    gain = max(p[metric] for p in within) - fixed[metric] if within else None
    saving = 1 - min(p["cost"] for p in as_good) / fixed["cost"] if as_good and fixed["cost"] > 0 else None
    beaten = any(p["cost"] < fixed["cost"] or p[metric] > fixed[metric] for p in within if p[metric] >= fixed[metric])
    return {"dominated": beaten, "gain_at_cost": gain, "cost_saving_at_accuracy": saving}


def compare_with_hull(point: dict[str, Any], hull: Hull) -> dict[str, Any]:
    """`point` (a measured `cost` and `accuracy`) with the hull's accuracy at its cost and its gain over it, both
    None outside the fixed models' cost range."""
    baseline = hull.at(point["cost"])
    gain = None if baseline is None else point["accuracy"] - baseline
    return {**point, "hull_accuracy": baseline, "gain_over_hull": gain}


def data_thresholds(table: LevelTable, count: int = THRESHOLD_QUANTILES) -> list[float]:
    """The thresholds worth sweeping on `table`: its own per-level accuracies at `count` evenly spaced quantiles
    (each quantile an observed value, so a table of up to `count` values gives every one). A score on any scale
    (probabilities of 1e-6, negated losses) gets thresholds that separate its models, where a fixed 0.01 grid over
    [0, 1] would put them all on one side.

    >>> data_thresholds(LevelTable((1, 2), ("s", "l"), np.array([[1e-6, 3e-4], [2e-6, 5e-4]]), np.ones((2, 2)),
    ...                            np.array([0.5, 0.5])))
    [1e-06, 2e-06, 0.0003, 0.0005]
    """
    values = np.quantile(table.accuracy.ravel(), np.linspace(0, 1, count), method="lower")
    return sorted({float(value) for value in values})


def frontier(
    calibration: Outcomes,
    test: Outcomes,
    thresholds: Sequence[float] | None = None,
    policies: Sequence[str] = POLICIES,
) -> dict[str, Any]:
    """Every policy at every threshold (by default `data_thresholds` of the calibration table), chosen on
    `calibration` and measured on `test`, with each fixed model's point on `test` and, per policy and fixed model,
    whether routing beats it (in the policy's own metric); every point is compared with the fixed models'
    random-mix hull (`hull`: its vertices)."""
    if calibration.models != test.models:
        raise InputError(f"calibration models {list(calibration.models)} differ from test's {list(test.models)}")
    unknown = sorted(set(policies) - set(ROUTERS))
    if unknown:
        raise InputError(f"unknown routing policies {unknown}; choose from {list(ROUTERS)}")
    table = calibration.by_level()
    unseen = sorted(set(test.levels.tolist()) - set(table.levels))
    if unseen:
        raise InputError(f"test levels {unseen} have no calibration examples to choose their model from")
    if thresholds is None:
        thresholds = data_thresholds(table)
    measured = {model: measure(test, lambda level, model=model: model) for model in test.models}
    hull = upper_hull(HullPoint(point["cost"], point["accuracy"], model) for model, point in measured.items())
    fixed = {model: compare_with_hull(point, hull) for model, point in measured.items()}
    result: dict[str, Any] = {
        "models": list(test.models),
        "levels": list(table.levels),
        "calibration": {
            "accuracy": table.accuracy.tolist(),
            "cost": table.cost.tolist(),
            "share": table.share.tolist(),
        },
        "fixed": fixed,
        "hull": [vars(vertex) for vertex in hull.vertices],
        "routed": {},
        "dominance": {},
    }
    for policy in policies:
        points: dict[tuple, dict[str, Any]] = {}
        for threshold in thresholds:
            assignment = ROUTERS[policy](table, float(threshold))
            key = tuple(assignment[level] for level in table.levels)
            if key in points:  # the same routing from another threshold: one point, its threshold range
                points[key]["thresholds"].append(float(threshold))
                continue
            routed = {
                "thresholds": [float(threshold)],
                "assignment": assignment,
                **measure(test, assignment.__getitem__),
            }
            points[key] = compare_with_hull(routed, hull)
        result["routed"][policy] = list(points.values())
        metric = METRIC_OF_POLICY[policy]
        result["dominance"][policy] = {
            model: _dominance(result["routed"][policy], point, metric) for model, point in fixed.items()
        }
    return result


def plot_frontier(
    result: dict[str, Any],
    path: str | Path,
    cost_label: str = "cost per example",
    scale: ScoreScale = SCORE_SCALES["correct"],
) -> Path:
    """Two panels (average score, minimum score over levels, on `scale`) against cost: the fixed models as
    labelled points, each policy's routed points as a line in cost order."""
    figure, axes = pyplot().subplots(1, 2, figsize=(9, 3.6), sharex=True)
    titles = (f"average {scale.name}", f"{'maximum' if scale.sign < 0 else 'minimum'} {scale.name} over levels")
    for axis, metric, title in zip(axes, ("accuracy", "minimum_accuracy"), titles):
        fixed = result["fixed"]
        axis.plot(
            [p["cost"] for p in fixed.values()], [scale.shown(p[metric]) for p in fixed.values()], "ks",
            label="fixed size",
        )  # fmt: skip
        if metric == "accuracy":  # the random-mix baseline is a hull of average scores
            hull = result["hull"]
            axis.plot([v["cost"] for v in hull], [scale.shown(v["accuracy"]) for v in hull], "k:",
                      label="random mix of sizes")  # fmt: skip
        for model, point in fixed.items():
            axis.annotate(
                model, (point["cost"], scale.shown(point[metric])), fontsize=7, xytext=(3, -8),
                textcoords="offset points",
            )  # fmt: skip
        for policy, points in result["routed"].items():
            ordered = sorted(points, key=lambda p: p["cost"])
            axis.plot([p["cost"] for p in ordered], [scale.shown(p[metric]) for p in ordered], marker=".",
                      label=f"routed ({policy})")  # fmt: skip
        axis.set_xlabel(cost_label)
        axis.set_ylabel(title)
        axis.set_title(f"{title} on the test split", fontsize=9)
    axes[0].legend(fontsize=7)
    return save_figure(figure, path)
