"""The ATLAS lab experiment's declared endpoints (version 1: `run_families` summarises them per family)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kinfolk.lab.methods.atlas.fronts import floored_log
from kinfolk.lab.methods.atlas.settings import AREA_RANGE, BASELINE, CONTROL, GAIN_LEVELS, METHODS, TARGETS
from kinfolk.lab.methods.replication import Endpoint


# ------------------------------------------------------------------------------------------------ endpoints
def _method_entry(record: dict[str, Any], target: str, method: str) -> dict[str, Any] | None:
    return record["analysis"][target].get("methods", {}).get(method)


def _versus(target: str, method: str, other: str, key: str):
    def value(record: dict[str, Any]) -> list[float | None]:
        entry = _method_entry(record, target, method)
        return [None if entry is None else entry["versus"][other][key]]

    return value


def _reach(target: str, method: str):
    def value(record: dict[str, Any]) -> list[float | None]:
        entry = _method_entry(record, target, method)
        return [None if entry is None else entry["reach"] - record["analysis"][target]["lora_best"]]

    return value


def _norm_ratio(target: str, method: str, norm: str):
    def value(record: dict[str, Any]) -> list[float | None]:
        ours, theirs = _method_entry(record, target, method), _method_entry(record, target, BASELINE)
        if ours is None or ours["mid"] is None or theirs is None or theirs["mid"] is None:
            return [None]
        return [floored_log(ours["mid"][norm]) - floored_log(theirs["mid"][norm])]

    return value


def _geometry(target: str, key: str):
    def value(record: dict[str, Any]) -> list[float]:
        entry = record["geometry"][target]
        if key == "distance_ratio":
            return [entry["target_distance"] / entry["retained_distance"]]
        return [entry[key]]

    return value


COMPARISONS = {
    "area": "mean over the comparison range ({low:g}-{high:g} of LoRA's gain) of ln(KL_{method} / KL_{other}) between "
    "the test fronts",
    "kl_mid": "ln(KL_{method} / KL_{other}) at the mid level ({mid:g} of LoRA's gain), test fronts",
    "kl_plateau": "ln(KL_{method} / KL_{other}) near the plateau ({plateau:g} of LoRA's gain), test fronts",
}


def declare_endpoints(targets: Sequence[str] = TARGETS, methods: Sequence[str] = METHODS) -> list[Endpoint]:
    """Primary: per target, every method against LoRA and full ATLAS against the norm-matched control (the area
    between the KL fronts and the KL at the two levels; lower is better). Then the exploratory ones."""
    fractions = {"low": AREA_RANGE[0], "high": AREA_RANGE[1], **GAIN_LEVELS}
    pairs = [(m, BASELINE) for m in methods if m != BASELINE]
    if "atlas" in methods and CONTROL in methods:
        pairs.append(("atlas", CONTROL))
    endpoints = []
    for target in targets:
        for method, other in pairs:
            for key, text in COMPARISONS.items():
                endpoints.append(
                    Endpoint(
                        f"{target}/{method} {key} vs {other}",
                        f"{target}: " + text.format(method=method, other=other, **fractions),
                        _versus(target, method, other, key),
                        baseline=other,
                        primary=True,
                        higher_is_better=False,
                    )
                )
    for target in targets:
        for method in methods:
            if method == BASELINE:
                continue
            for level in GAIN_LEVELS:
                endpoints.append(
                    Endpoint(
                        f"{target}/{method} forgot_{level} vs {BASELINE}",
                        f"{target}: retained answers turned correct → wrong per frozen-correct problem, {method} minus "
                        f"LoRA, at the {level} level (test fronts)",
                        _versus(target, method, BASELINE, f"forgot_{level}"),
                        baseline=BASELINE,
                        higher_is_better=False,
                    )
                )
            endpoints.append(
                Endpoint(
                    f"{target}/{method} reach vs {BASELINE}",
                    f"{target}: {method}'s best test score among its chosen runs minus LoRA's",
                    _reach(target, method),
                    baseline=BASELINE,
                )
            )
            for norm in ("norm_target", "norm_retained"):
                endpoints.append(
                    Endpoint(
                        f"{target}/{method} {norm} vs {BASELINE}",
                        f"{target}: ln of the mean per-token update norm on {norm.split('_')[1]} tokens, {method} over "
                        "LoRA, at their front points of the mid level",
                        _norm_ratio(target, method, norm),
                        baseline=BASELINE,
                        higher_is_better=False,
                    )
                )
        for key, text in (
            ("distance_ratio", "mean routed distance of target tokens over that of held-out retained tokens"),
            ("target_beyond_retained_p95", "share of target tokens farther from the atlas than 95 % of retained ones"),
            ("target_rho", "mean ρ(h) (ATLAS's PCA scale) on target tokens"),
            ("retained_rho", "mean ρ(h) on held-out retained tokens"),
        ):
            endpoints.append(Endpoint(f"{target}/geometry {key}", f"{target}: {text}", _geometry(target, key)))
    return endpoints


ENDPOINTS = declare_endpoints()
