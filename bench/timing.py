"""Paired timing for the benches: run the compared methods in turn, take their ratio pair by pair, and decide a goal
only when the ratio's spread lies wholly on one side of its threshold.

A machine shared with other jobs changes speed from one second to the next. Timing each method on its own and
comparing best-of or mean times then compares different machines; timing A and B back to back, round after round
(A B, B A, A B, … after a warm-up), and dividing within each round compares them on the same machine, whatever its
speed was in that round. The median of the per-round ratios is the estimate and their interquartile range the
spread: a goal whose spread straddles its threshold is "undecided", not passed or failed on noise.

>>> ticks = iter(range(100))
>>> samples = interleaved({"a": lambda: None, "b": lambda: None}, repeats=3, warmup=0, clock=lambda: next(ticks))
>>> samples  # every call of the fake clock advances by 1, so each run takes one tick
{'a': [1, 1, 1], 'b': [1, 1, 1]}
>>> spread = paired_ratio([2.0, 2.2, 1.8, 2.0], [1.0, 1.0, 1.0, 1.0])
>>> spread.median, spread.low, spread.high
(2.0, 1.95, 2.05)
>>> verdict(spread, "<= 2.1"), verdict(spread, "<= 2.0"), verdict(spread, ">= 2.1")
('pass', 'undecided', 'fail')
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"


def clock_for(device: str) -> Callable[[], float]:
    """Wall time on a GPU (the work runs outside this process's CPU time); on a CPU this process's CPU time, which
    a neighbour on another core does not inflate the way it inflates wall time."""
    return time.perf_counter if device.startswith("cuda") else time.process_time


def interleaved(
    runs: Mapping[str, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    clock: Callable[[], float] = time.process_time,
    synchronize: Callable[[], None] = lambda: None,
) -> dict[str, list[float]]:
    """Seconds of each run per round: `warmup` untimed rounds, then `repeats` timed rounds in which every run goes
    once. The order rotates by one each round (A B C, B C A, C A B, …) so no run always goes first, when caches are
    cold, or last; entry i of every list comes from round i, which is what `paired_ratio` pairs."""
    if repeats < 1:
        raise ValueError(f"interleaved needs at least one timed round, got repeats={repeats}")
    names = list(runs)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(warmup + repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            synchronize()
            start = clock()
            runs[name]()
            synchronize()
            if round_ >= warmup:
                seconds[name].append(clock() - start)
    return seconds


@dataclass(frozen=True)
class Spread:
    """A ratio as the median of per-pair ratios, with their lower and upper quartiles (`low`, `high`) and the
    number of pairs; a deterministic figure (bytes, an exact disagreement) is a spread of width zero."""

    median: float
    low: float
    high: float
    pairs: int

    @classmethod
    def exact(cls, value: float) -> Spread:
        """A figure that does not vary between runs: decided by its value alone."""
        return cls(value, value, value, 1)

    def rounded(self, digits: int = 5) -> list[float]:
        """`[low, high]` for the JSON line, to `digits` significant digits."""
        return [significant(self.low, digits), significant(self.high, digits)]


def significant(value: float, digits: int = 5) -> float:
    """`value` to `digits` significant digits: a ratio near 1 and a disagreement near 1e-7 both keep their detail."""
    return float(f"{value:.{digits}g}")


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """Lower quartile, median and upper quartile with linear interpolation between order statistics (NumPy's
    default `percentile` method): for n sorted values, quantile q sits at position q·(n − 1)."""
    if not values:
        raise ValueError("quartiles of no values")
    ordered = sorted(values)

    def at(q: float) -> float:
        position = q * (len(ordered) - 1)
        below = int(position)
        above = min(below + 1, len(ordered) - 1)
        return ordered[below] + (position - below) * (ordered[above] - ordered[below])

    return at(0.25), statistics.median(ordered), at(0.75)


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> Spread:
    """Median and quartiles of `numerators[i] / denominators[i]`, the pairs measured in the same round."""
    if len(numerators) != len(denominators):
        raise ValueError(f"paired_ratio needs pairs, got {len(numerators)} and {len(denominators)} values")
    low, median, high = quartiles([a / b for a, b in zip(numerators, denominators)])
    return Spread(median, low, high, len(numerators))


def verdict(spread: Spread, goal: str) -> str:
    """ "pass" when the whole spread meets `goal` ("<= 1.2", ">= 3"), "fail" when none of it does, else
    "undecided": the noise is too wide to tell on which side of the threshold the ratio lies."""
    op, bound_text = goal.split()
    bound = float(bound_text)
    if op == "<=":
        meets_high, meets_low = spread.high <= bound, spread.low <= bound
    elif op == ">=":
        meets_high, meets_low = spread.low >= bound, spread.high >= bound
    else:
        raise ValueError(f"goal {goal!r}: expected '<= number' or '>= number'")
    if meets_high:
        return PASS
    return UNDECIDED if meets_low else FAIL


def overall(verdicts: Mapping[str, str]) -> bool | None:
    """The bench's `pass`: False when any goal fails, True when every goal passes, None (undecided) otherwise."""
    if FAIL in verdicts.values():
        return False
    return True if all(value == PASS for value in verdicts.values()) else None


def report(
    bench: str, figures: dict, spreads: Mapping[str, Spread], goals: Mapping[str, str], digits: int = 4
) -> dict:
    """The benches' one JSON line: figures; each ratio's median, its spread `[low, high]`; the goals, each goal's
    verdict, and `pass` (true, false or null for undecided)."""
    verdicts = {name: verdict(spreads[name], goal) for name, goal in goals.items()}
    return {
        "bench": bench,
        "figures": figures,
        "ratios": {name: significant(spread.median, digits) for name, spread in spreads.items()},
        "spread": {name: spread.rounded(digits) for name, spread in spreads.items()},
        "goals": dict(goals),
        "verdicts": verdicts,
        "pass": overall(verdicts),
    }
