"""The analysis stage's statistics, over units, as the protocol asks for them.

Per endpoint: each unit's value (the mean over its runs; undefined if any run is), their mean, a t-interval with
U − 1 degrees of freedom, a two-stage cluster bootstrap (units, then runs inside each; with one run per unit it is a
plain bootstrap over units, and the results say so), the number of units favouring the method, and for primaries a
two-sided one-sample t-test against the endpoint's null with Holm's correction across the experiment's primaries.
An endpoint undefined in some unit has no interval and no test (an interval over the units that happened to define
it would be conditional on that); Holm then runs over the primaries that have a test. A bounded statistic (a
concordance lies in [0, 1]) has its t-interval clipped to its `range`, and says so: `ci95_clipped` (whether an end
moved) and `ci95_unclipped` (the t-interval itself).

>>> from kinfolk.lab.protocol.plan import PrimaryEndpoint
>>> from kinfolk.lab.protocol.records import EndpointValue
>>> gain = PrimaryEndpoint("gain", "accuracy minus uniform", "uniform", "higher")
>>> runs = [[EndpointValue(v, 0.5 + v, 0.5)] for v in (0.21, 0.25, 0.19, 0.30, 0.22)]
>>> entry = summarise(gain, runs, primary=True)
>>> entry["mean"], entry["ci95"], entry["favours_method"], round(entry["p"], 5)
(0.234, [0.180883, 0.287117], 5, 0.00026)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kinfolk.lab.protocol.experiment import ExploratoryEndpoint
from kinfolk.lab.protocol.plan import PrimaryEndpoint
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.stats import (
    HOLM_LEVEL,
    MIN_INTERVAL_UNITS,
    cluster_bootstrap_interval,
    holm,
    one_sample_t_p,
    t_interval,
)

DIGITS = 6


def _rounded(value: float | None) -> float | None:
    return None if value is None else float(round(value, DIGITS))


def _unit_mean(values: Sequence[float | None]) -> float | None:
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return None
    return sum(values) / len(values)


def summarise(
    endpoint: PrimaryEndpoint | ExploratoryEndpoint,
    runs_per_unit: Sequence[Sequence[EndpointValue]],
    primary: bool,
    floor: float | None = None,
    value_range: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """One endpoint's entry of the results JSON from its run values in each unit (same order as the units);
    `value_range` bounds a statistic whose t-interval could leave it (clipped, and flagged).

    >>> concordance = PrimaryEndpoint("c", "concordance", "no trend", "higher", null=0.5)
    >>> entry = summarise(concordance, [[EndpointValue(v)] for v in (1.0, 1.0, 0.75, 1.0, 0.9)], True, None, (0, 1))
    >>> entry["ci95"], entry["ci95_clipped"], entry["ci95_unclipped"]
    ([0.793983, 1.0], True, [0.793983, 1.066017])
    """
    per_unit = [_rounded(_unit_mean([v.value for v in runs])) for runs in runs_per_unit]
    defined = [v for v in per_unit if v is not None]
    favours = sum((v > endpoint.null) if endpoint.direction == "higher" else (v < endpoint.null) for v in defined)
    entry: dict[str, Any] = {
        "primary": primary,
        "description": endpoint.description,
        "baseline": endpoint.baseline,
        "direction": endpoint.direction,
        "higher_is_better": endpoint.direction == "higher",
        "null": endpoint.null,
        "per_unit": per_unit,
        "per_run": [[_rounded(v.value) for v in runs] for runs in runs_per_unit],
        "mean": _rounded(sum(defined) / len(defined)) if defined else None,
        "ci95": None,
        "ci_method": "t",
        "favours_method": int(favours),
        "undefined_units": len(per_unit) - len(defined),
        "absolute": {
            "method": [_rounded(_unit_mean([v.method for v in runs])) for runs in runs_per_unit],
            "baseline": [_rounded(_unit_mean([v.baseline for v in runs])) for runs in runs_per_unit],
        },
        "floor": floor,
        "grid_edge": any(v.grid_edge for runs in runs_per_unit for v in runs),
    }
    complete = len(defined) == len(per_unit) >= MIN_INTERVAL_UNITS
    if complete:
        interval = t_interval(defined)
        entry["ci95"] = [_rounded(interval.low), _rounded(interval.high)]
        runs = [[v.value for v in unit] for unit in runs_per_unit]
        cluster = cluster_bootstrap_interval(runs)
        entry["cluster_bootstrap95"] = [_rounded(cluster.low), _rounded(cluster.high)]
    if value_range is not None:
        entry["range"] = [float(end) for end in value_range]
        entry["ci95_unclipped"] = entry["ci95"]
        if entry["ci95"] is not None:
            entry["ci95"] = [float(min(max(end, value_range[0]), value_range[1])) for end in entry["ci95"]]
        entry["ci95_clipped"] = entry["ci95"] != entry["ci95_unclipped"]
    if primary:
        entry["p"] = one_sample_t_p(defined, endpoint.null) if complete else None
    return entry


def correct(endpoints: dict[str, dict[str, Any]]) -> None:
    """Add Holm-adjusted p-values (`p_holm`, `survives_holm`) to the primaries that have a test, in place."""
    tested = [name for name, e in endpoints.items() if e["primary"] and e.get("p") is not None]
    for name, adjusted in zip(tested, holm([endpoints[n]["p"] for n in tested])):
        endpoints[name]["p_holm"] = adjusted
        endpoints[name]["survives_holm"] = adjusted < HOLM_LEVEL
    for entry in endpoints.values():
        if entry["primary"] and entry.get("p") is None:
            entry["p_holm"], entry["survives_holm"] = None, False
