"""bench/timing.py, the benches' paired timing: the order it runs methods in, which samples it pairs, the median and
quartiles of the paired ratios, and the rule that a goal whose spread straddles its threshold is undecided.

Every clock here is fake (a counter the runs advance by set amounts), so nothing depends on the machine's speed;
the expected numbers are worked out by hand in the comments.
"""

import doctest
import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "bench" / "timing.py"
_SPEC = importlib.util.spec_from_file_location("bench_timing", _PATH)
timing = sys.modules[_SPEC.name] = importlib.util.module_from_spec(_SPEC)  # dataclasses look their module up
_SPEC.loader.exec_module(timing)


class FakeMachine:
    """A clock that only moves when a run says how long it took: `cost[name] × speed of the current call`."""

    def __init__(self, cost: dict[str, float], slowdowns: list[float]):
        self.now = 0.0
        self.cost = cost
        self.slowdowns = iter(slowdowns)
        self.calls: list[str] = []

    def clock(self) -> float:
        return self.now

    def run(self, name: str):
        def go():
            self.calls.append(name)
            self.now += self.cost[name] * next(self.slowdowns)

        return go


def test_interleaved_rotates_the_order_and_drops_the_warmup_rounds():
    machine = FakeMachine({"a": 2.0, "b": 1.0, "c": 4.0}, slowdowns=[1.0] * 3 + [1, 1, 1, 3, 3, 3, 10, 10, 10])
    runs = {name: machine.run(name) for name in "abc"}
    seconds = timing.interleaved(runs, repeats=3, warmup=1, clock=machine.clock)
    # round 0 (warm-up) a b c; round 1 b c a; round 2 c a b; round 3 a b c
    assert machine.calls == list("abcbcacababc")
    # the machine is 1×, 3×, 10× slower in the three timed rounds (a round's three calls share one slowdown)
    assert seconds == {"a": [2.0, 6.0, 20.0], "b": [1.0, 3.0, 10.0], "c": [4.0, 12.0, 40.0]}
    # pairing cancels the drift entirely: a/b is 2 in every round, with no spread
    assert timing.paired_ratio(seconds["a"], seconds["b"]) == timing.Spread(2.0, 2.0, 2.0, 3)


def test_interleaved_synchronizes_around_every_timed_call():
    events = []
    runs = {"a": lambda: events.append("a"), "b": lambda: events.append("b")}
    timing.interleaved(runs, repeats=1, warmup=0, clock=lambda: 0.0, synchronize=lambda: events.append("|"))
    assert events == ["|", "a", "|", "|", "b", "|"]


def test_interleaved_needs_a_timed_round():
    with pytest.raises(ValueError, match="repeats=0"):
        timing.interleaved({"a": lambda: None}, repeats=0)


def test_ratios_are_taken_within_rounds_not_between_sorted_lists():
    # a was fast in round 0 and slow in round 1, b the other way round: per round 1/10 = 0.1 and 10/1 = 10
    spread = timing.paired_ratio([1.0, 10.0], [10.0, 1.0])
    # two values: median (0.1 + 10) / 2 = 5.05; quartiles at positions 0.25 and 0.75 between them:
    # 0.1 + 0.25 · 9.9 = 2.575 and 0.1 + 0.75 · 9.9 = 7.525 (best-of would have said min/min = 1.0)
    assert spread.median == pytest.approx(5.05)
    assert spread.low == pytest.approx(2.575)
    assert spread.high == pytest.approx(7.525)
    assert spread.pairs == 2


def test_quartiles_of_five_values_by_hand():
    # sorted 1 2 4 8 16: positions 0.25·4 = 1 and 0.75·4 = 3 fall on order statistics 2 and 8; the median is 4
    assert timing.quartiles([16.0, 1.0, 8.0, 2.0, 4.0]) == (2.0, 4.0, 8.0)
    # sorted 1 2 3 5 (n = 4): Q1 at position 0.75 → 1 + 0.75·1 = 1.75; median 2.5; Q3 at 2.25 → 3 + 0.25·2 = 3.5
    assert timing.quartiles([5.0, 3.0, 1.0, 2.0]) == pytest.approx((1.75, 2.5, 3.5))
    assert timing.quartiles([7.0]) == (7.0, 7.0, 7.0)


def test_paired_ratio_refuses_unpaired_lists():
    with pytest.raises(ValueError, match="3 and 2"):
        timing.paired_ratio([1.0, 2.0, 3.0], [1.0, 2.0])


@pytest.mark.parametrize(
    ("low", "high", "goal", "expected"),
    [
        (0.9, 1.1, "<= 1.2", "pass"),
        (0.9, 1.2, "<= 1.2", "pass"),  # the threshold itself meets "<="
        (1.1, 1.3, "<= 1.2", "undecided"),
        (1.25, 1.3, "<= 1.2", "fail"),
        (3.0, 3.5, ">= 3", "pass"),
        (2.5, 3.5, ">= 3", "undecided"),
        (2.0, 2.9, ">= 3", "fail"),
    ],
)
def test_a_goal_is_decided_only_by_a_spread_on_one_side_of_it(low, high, goal, expected):
    assert timing.verdict(timing.Spread((low + high) / 2, low, high, 5), goal) == expected


def test_an_exact_figure_is_never_undecided():
    assert timing.verdict(timing.Spread.exact(1.0), "<= 1.0") == "pass"
    assert timing.verdict(timing.Spread.exact(1.0001), "<= 1.0") == "fail"


def test_a_goal_needs_a_comparison():
    with pytest.raises(ValueError, match="expected"):
        timing.verdict(timing.Spread.exact(1.0), "< 1.0")


def test_overall_fails_on_any_failure_and_is_null_while_a_goal_is_undecided():
    assert timing.overall({"x": "pass", "y": "pass"}) is True
    assert timing.overall({"x": "pass", "y": "undecided"}) is None
    assert timing.overall({"x": "fail", "y": "undecided"}) is False


def test_report_keeps_the_bench_line_and_adds_spread_and_verdicts():
    spreads = {"speed": timing.paired_ratio([1.0, 1.1, 1.3], [1.0, 1.0, 1.0]), "bytes": timing.Spread.exact(0.5)}
    line = timing.report("demo", {"n": 3}, spreads, {"speed": "<= 1.25", "bytes": "<= 1.0"})
    # ratios 1.0 1.1 1.3: median 1.1, Q1 1.05, Q3 1.2 (position 1.5, halfway from 1.1 to 1.3)
    assert json.loads(json.dumps(line)) == {
        "bench": "demo",
        "figures": {"n": 3},
        "ratios": {"speed": 1.1, "bytes": 0.5},
        "spread": {"speed": [1.05, 1.2], "bytes": [0.5, 0.5]},
        "goals": {"speed": "<= 1.25", "bytes": "<= 1.0"},
        "verdicts": {"speed": "pass", "bytes": "pass"},
        "pass": True,
    }


def test_the_line_keeps_significant_digits_of_small_and_large_figures():
    assert timing.significant(1.234567) == 1.2346
    assert timing.significant(3.21987e-7) == 3.2199e-7
    assert timing.significant(12345.678, 3) == 12300.0


def test_docstring_example():
    assert doctest.testmod(timing).failed == 0
