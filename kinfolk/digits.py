"""Numbers printed with enough digits to tell them apart: a table of scores of 1.7e-6 and 1.1e-10 printed to four
decimals reads 0.0000 twice, and a reader cannot act on two values that print alike.

`distinct_format(values)` is the fewest significant digits (at least `least`) at which every distinct value of
`values` prints differently, as a format spec (trailing zeros kept, so a column's values line up);
`shown(value, spec)` prints one value with it.

>>> spec = distinct_format([1.7e-6, 1.1e-10, 0.61])
>>> [shown(v, spec) for v in (1.7e-6, 1.1e-10, 0.61)]
['1.70e-06', '1.10e-10', '0.610']
>>> spec = distinct_format([0.12341, 0.12344])
>>> spec, shown(0.12341, spec), shown(None, spec)
('#.5g', '0.12341', 'n/a')
"""

from __future__ import annotations

from collections.abc import Iterable

MOST_DIGITS = 12  # a float's 17 digits hold noise past here; values equal to 12 digits print alike


def distinct_format(values: Iterable[float | None], least: int = 3) -> str:
    """The format spec (`#.Ng`) with the fewest significant digits N >= `least` at which the distinct values of
    `values` (None skipped) print distinctly."""
    distinct = {float(value) for value in values if value is not None}
    for digits in range(least, MOST_DIGITS + 1):
        if len({format(value, f"#.{digits}g") for value in distinct}) == len(distinct):
            return f"#.{digits}g"
    return f"#.{MOST_DIGITS}g"


def shown(value: float | None, spec: str) -> str:
    """`value` printed with `spec`, 'n/a' for None."""
    return "n/a" if value is None else format(value, spec)
