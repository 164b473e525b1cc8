"""The baseline a router has to beat: the best accuracy a random mix of fixed sizes reaches at an expected cost.

Sending each example to size a with probability p and to size b otherwise costs p·c_a + (1 − p)·c_b per example on
average and is right p·acc_a + (1 − p)·acc_b of the time. So the random mixes of a family's fixed sizes reach
exactly the points under the upper concave hull of the sizes' (cost, accuracy) points, and a mix of the two hull
vertices around a cost c reaches the hull's value there: the best accuracy at expected cost c for anyone who does
not look at the examples. A router that does not beat the hull gains nothing a user could not get by mixing sizes
at random. The hull is defined from the cheapest size's cost to the dearest's, nowhere else.

>>> hull = upper_hull([HullPoint(1, 0.5, "s"), HullPoint(2, 0.6, "m"), HullPoint(3, 0.9, "l")])
>>> [vertex.name for vertex in hull.vertices]  # m lies under the s–l segment, which is 0.7 at its cost
['s', 'l']
>>> hull.at(2), hull.at(3), hull.at(0.5)
(0.7, 0.9, None)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kinfolk.errors import InputError


@dataclass(frozen=True)
class HullPoint:
    """One fixed size's mean cost per example and accuracy."""

    cost: float
    accuracy: float
    name: str = ""


@dataclass(frozen=True)
class Hull:
    """The upper concave hull's vertices, cheapest first (at most one per cost)."""

    vertices: tuple[HullPoint, ...]

    def at(self, cost: float) -> float | None:
        """The best accuracy a random mix of the sizes reaches at expected cost `cost`: linear between the hull's
        vertices; None below the cheapest size's cost or above the dearest's."""
        first, last = self.vertices[0], self.vertices[-1]
        if cost < first.cost or cost > last.cost:
            return None
        for left, right in zip(self.vertices, self.vertices[1:]):
            if cost <= right.cost:
                if cost == right.cost:
                    return right.accuracy
                share = (cost - left.cost) / (right.cost - left.cost)
                return left.accuracy + share * (right.accuracy - left.accuracy)
        return last.accuracy  # a single vertex, at its own cost


def _turns_up_or_straight(left: HullPoint, middle: HullPoint, right: HullPoint) -> bool:
    """Whether `middle` lies on or under the segment from `left` to `right` (so it is no vertex of the upper hull)."""
    cross = (middle.cost - left.cost) * (right.accuracy - left.accuracy) - (middle.accuracy - left.accuracy) * (
        right.cost - left.cost
    )
    return cross >= 0


def upper_hull(points: Iterable[HullPoint]) -> Hull:
    """The upper concave hull of `points` (Andrew's monotone chain): of points at one cost only the most accurate
    counts, and points on or under a segment between two others are dropped."""
    best_at_cost: dict[float, HullPoint] = {}
    for point in points:
        kept = best_at_cost.get(point.cost)
        if kept is None or point.accuracy > kept.accuracy:
            best_at_cost[point.cost] = point
    if not best_at_cost:
        raise InputError("the random-mix hull needs at least one fixed size's (cost, accuracy) point")
    chain: list[HullPoint] = []
    for point in sorted(best_at_cost.values(), key=lambda p: p.cost):
        while len(chain) >= 2 and _turns_up_or_straight(chain[-2], chain[-1], point):
            chain.pop()
        chain.append(point)
    return Hull(tuple(chain))
