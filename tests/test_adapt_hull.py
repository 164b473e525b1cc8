"""The random-mix baseline of routing (issue 39): the upper concave hull of the fixed sizes' (cost, accuracy) points
against hand-computed values and a brute-force search over pairs of sizes, and `kinfolk route`'s report of it (the
table in cost order with the hull column, the plain verdict, --help)."""

import itertools
import random

import numpy as np
import pytest

from kinfolk.commands import main
from kinfolk.commands.route import hull_verdict, summary
from kinfolk.errors import InputError
from kinfolk.plugins.adapt.hull import HullPoint, upper_hull
from kinfolk.plugins.adapt.routing import Outcomes, frontier

# B is above the A–D chord (0.4 at cost 2); C lies on the B–D segment (collinear); E is under it (dominated); F
# shares B's cost with less accuracy; G is as accurate as D but dearer (a flat last segment).
A, B, C, D = HullPoint(1, 0.2, "A"), HullPoint(2, 0.5, "B"), HullPoint(3, 0.65, "C"), HullPoint(4, 0.8, "D")
E, F, G = HullPoint(3, 0.4, "E"), HullPoint(2, 0.3, "F"), HullPoint(5, 0.8, "G")


def test_upper_hull_by_hand():
    hull = upper_hull([C, E, A, G, F, D, B])  # any order
    assert [vertex.name for vertex in hull.vertices] == ["A", "B", "D", "G"]
    expected = {
        1: 0.2,  # A itself
        1.5: 0.35,  # halfway A–B
        2: 0.5,  # B, not F
        3: 0.65,  # the collinear C's own accuracy, not the dominated E's
        3.5: 0.725,  # three quarters of the way from B to D: 0.5 + 0.75 · 0.3
        4.5: 0.8,  # the flat D–G segment
        5: 0.8,
    }
    for cost, accuracy in expected.items():
        assert hull.at(cost) == pytest.approx(accuracy), cost
    assert hull.at(0.99) is None and hull.at(5.01) is None  # no mix of sizes costs less or more


def test_a_single_size_is_its_own_hull():
    hull = upper_hull([HullPoint(2, 0.7, "only"), HullPoint(2, 0.6, "same cost, worse")])
    assert hull.at(2) == 0.7 and hull.at(1.9) is None and hull.at(2.1) is None
    with pytest.raises(InputError, match="at least one"):
        upper_hull([])


def _best_mix(points, cost):
    """Brute force: the best accuracy of any mix of two points (or one point alone) whose expected cost is `cost`."""
    reachable = []
    for left, right in itertools.product(points, repeat=2):
        if left.cost == right.cost == cost:
            reachable.append(left.accuracy)
        elif left.cost <= cost <= right.cost and left.cost < right.cost:
            share = (cost - left.cost) / (right.cost - left.cost)
            reachable.append(left.accuracy + share * (right.accuracy - left.accuracy))
    return max(reachable, default=None)


def test_upper_hull_is_the_best_mix_of_two_sizes_on_random_families():
    rng = random.Random(0)
    for _ in range(50):
        points = [HullPoint(rng.randint(1, 8), rng.randint(0, 10) / 10) for _ in range(rng.randint(1, 6))]
        hull = upper_hull(points)
        for cost in np.linspace(0, 9, 37):
            expected = _best_mix(points, float(cost))
            got = hull.at(float(cost))
            assert (got is None) == (expected is None), (points, cost)
            if expected is not None:
                assert got == pytest.approx(expected), (points, cost)


MODELS = ("s", "m", "l")


def _by_hand_frontier():
    """The routing tests' hand-worked case: on the test split s is 2/3 right at cost 8/3, m 2/3 at 14/3, l 1 at 28/3;
    the minimum policy routes (s, s) at 2/3 and cost 8/3 and (s, l) at 1 and cost 16/3."""
    tokens_cost = [1.0, 2.0, 4.0]
    calibration = Outcomes(MODELS, [1, 1, 2, 2], [[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 1, 1]], [tokens_cost] * 4)
    test_tokens = np.asarray([[2, 2, 2], [2, 2, 2], [4, 3, 3]], dtype=float)
    test = Outcomes(MODELS, [1, 1, 2], [[1, 0, 1], [1, 1, 1], [0, 1, 1]], test_tokens * tokens_cost)
    return frontier(calibration, test, thresholds=[0.0, 0.9, 1.0], policies=["minimum"])


def test_frontier_compares_every_point_with_the_hull_by_hand():
    result = _by_hand_frontier()
    # hull: s (8/3, 2/3) to l (28/3, 1); m (2/3 at 14/3) lies under it, where the hull is 2/3 + 1/3 · 6/20 = 0.7667
    assert [(v["name"], v["cost"], v["accuracy"]) for v in result["hull"]] == [
        ("s", pytest.approx(8 / 3), pytest.approx(2 / 3)),
        ("l", pytest.approx(28 / 3), 1.0),
    ]
    assert result["fixed"]["m"]["hull_accuracy"] == pytest.approx(2 / 3 + 0.1)
    assert result["fixed"]["m"]["gain_over_hull"] == pytest.approx(-0.1)
    same_as_s, routed = result["routed"]["minimum"]
    assert same_as_s["hull_accuracy"] == pytest.approx(2 / 3) and same_as_s["gain_over_hull"] == pytest.approx(0)
    # (s, l) at 16/3: the hull is 2/3 + 1/3 · (8/3) / (20/3) = 0.8, so routing beats it by 0.2
    assert routed["hull_accuracy"] == pytest.approx(0.8) and routed["gain_over_hull"] == pytest.approx(0.2)


def _table_rows(printed: str) -> list[list[str]]:
    lines = [line for line in printed.splitlines() if line.startswith("|")][2:]  # no header, no rule
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_route_table_is_in_cost_order_with_the_hull_column():
    printed = summary(_by_hand_frontier() | {"cost": "parameters"})
    rows = _table_rows(printed)
    # cost, kind, size or routing, accuracy, minimum accuracy, hull, accuracy − hull; fixed first at equal cost
    assert [row[:3] for row in rows] == [
        ["2.667", "fixed", "s"],
        ["2.667", "minimum", "1→s 2→s"],
        ["4.667", "fixed", "m"],
        ["5.333", "minimum", "1→s 2→l"],
        ["9.333", "fixed", "l"],
    ]
    assert [float(row[0]) for row in rows] == sorted(float(row[0]) for row in rows)
    assert [row[5] for row in rows] == ["0.667", "0.667", "0.767", "0.800", "1.00"]
    assert [row[6] for row in rows] == ["+0", "+0", "-0.1", "+0.2", "+0"]
    assert (
        "minimum: 1 of 2 routings beat the best random mix of two fixed sizes at equal cost; the best by 0.2 higher accuracy"
        in (printed)
    )


def test_route_says_plainly_when_no_routing_beats_the_hull():
    points = [
        {"gain_over_hull": 0.0, "cost": 1.0, "assignment": {1: "s"}},  # a hull vertex, reproduced
        {"gain_over_hull": -0.05, "cost": 2.0, "assignment": {1: "m"}},
        {"gain_over_hull": None, "cost": 9.0, "assignment": {1: "l"}},  # outside the sizes' cost range
    ]
    assert hull_verdict("average", points) == (
        "average: no routing beats the best random mix of two fixed sizes at equal cost; it gains nothing here that "
        "mixing sizes at random would not"
    )


def test_route_help_says_what_the_hull_is(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["route", "--help"])
    assert exit_info.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "best score any random mix of two fixed sizes reaches at that expected cost" in shown
    assert "(default: average minimum)" in shown and "np.float64" not in shown  # defaults as a user types them
    assert "a router that does not beat the hull gives nothing a user could not get by sending examples to" in shown
