"""ADAPT's selection rules and curve statistics, shared by every plan version (`reanalysis`, `controls`).

A curve is `{order: [size, ...]}` with each size's depth (`layers`), `validation` accuracy and `test` numbers
(`accuracy`, `kl`); a routing record holds the calibration split's accuracy and cost per level and size, the routed
candidates' assignments and every fixed size's and candidate's test accuracy and cost (`routing_record`).

- patch order (`chosen_orders`): per size k, the order with the higher validation accuracy; ties: back-to-front;
- routing threshold (`chosen_threshold`): the candidate whose calibration accuracy minus that of the most accurate
  fixed size at no more calibration cost is largest; ties: the lower calibration cost.

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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kinfolk.lab.methods.adapt.settings import ORDERS
from kinfolk.lab.protocol.records import EndpointValue

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
