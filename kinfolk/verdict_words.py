"""The words every kinfolk verdict uses, defined once: `kinfolk compare`'s verdict lines, `kinfolk drift`'s ratio
table and the lab's evidence say what a comparison established in these four, and docs/compare.md defines them.

- **shown**: the 95 % interval over seeds (or families, after the lab's Holm correction) excludes no difference,
  on the side it names ("less drift shown");
- **not shown**: there was an interval and it holds no difference: the data do not tell the methods apart (which
  is not the same as showing them equal);
- **not tested (n seeds; an interval needs 5)**: too few units for an interval (`kinfolk.stats.MIN_INTERVAL_UNITS`),
  so nothing was tested, whatever the ratio; the ratio is reported as a measurement, never as a verdict;
- **not reached**: a run never reached the level (it would only by extrapolation), so there is nothing to compare.

>>> not_tested(2)
'not tested (2 seeds; an interval needs 5)'
>>> judged(None, 2), judged((0.4, 0.8), 5), judged((0.8, 1.3), 5), judged((1.2, 1.5), 5)
('not tested', 'shown', 'not shown', 'shown')
"""

from __future__ import annotations

from kinfolk.stats import MIN_INTERVAL_UNITS

SHOWN, NOT_SHOWN, NOT_TESTED, NOT_REACHED = "shown", "not shown", "not tested", "not reached"
WORDS = (SHOWN, NOT_SHOWN, NOT_TESTED, NOT_REACHED)


def not_tested(units: int, unit: str = "seed") -> str:
    """The "not tested" verdict with why: how many units there were and how many an interval needs."""
    return f"{NOT_TESTED} ({units} {unit}{'s' * (units != 1)}; an interval needs {MIN_INTERVAL_UNITS})"


def judged(interval: tuple[float, float] | None, units: int, no_difference: float = 1.0) -> str:
    """SHOWN when `interval` (low, high) excludes `no_difference` (1 for a ratio, 0 for a difference), NOT_SHOWN when
    it holds it, NOT_TESTED when there is no interval (fewer than `MIN_INTERVAL_UNITS` units)."""
    if interval is None or units < MIN_INTERVAL_UNITS:
        return NOT_TESTED
    low, high = interval
    return SHOWN if high < no_difference or low > no_difference else NOT_SHOWN
