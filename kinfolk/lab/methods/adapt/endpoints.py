"""The ADAPT lab experiment's declared endpoints (version 1: `run_families` summarises them per family)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kinfolk.lab.methods.adapt.settings import METHODS, PHASES, ROUTED, ROUTING_POLICIES, STAGES, AdaptSettings
from kinfolk.lab.methods.replication import Endpoint


# ------------------------------------------------------------------------------------------------ endpoints
def _curve_value(variant: str, budget: int, key: str):
    return lambda record: [record["interpolation"][variant][str(budget)][key]]


def _size_gap(variant: str, method: str, baseline: str, metric: str, k: int | None = None):
    """method − baseline on `metric`, at size k or averaged over the sizes below the variant (k < M)."""

    def value(record: dict[str, Any]) -> list[float]:
        curves = record["transfer"][variant]["curves"]
        ours, theirs = curves[method]["chosen"], curves[baseline]["chosen"]
        read = (lambda s: s["test"]["mean"]) if metric == "accuracy" else (lambda s: s["kl"])
        gaps = [read(a) - read(b) for a, b in zip(ours, theirs)]
        return [gaps[k]] if k is not None else [float(np.mean(gaps[:-1]))]

    return value


def _routing_value(method: str, policy: str, key: str):
    def value(record: dict[str, Any]) -> list[float]:
        verdicts = record["routing"][method]["dominance"][policy].values()
        if key == "dominated":
            return [float(np.mean([v["dominated"] for v in verdicts]))]
        return [float(np.mean([v["gain_at_cost"] for v in verdicts]))]

    return value


def _interpolation_endpoints(settings: AdaptSettings) -> tuple[list[Endpoint], list[Endpoint]]:
    primary, exploratory = [], []
    for variant in settings.variants:
        for budget in settings.budgets:
            for key, what in (("accuracy", "accuracy"), ("KL", "−KL(variant ‖ model)")):
                primary.append(Endpoint(
                    f"interpolation/{variant}/{budget} {key} concordance",
                    f"{variant}'s directly two-phase-distilled family ({budget} steps): share of size pairs whose "
                    f"{what} rises with size (1 monotone, 0.5 no trend), sizes k = 0..M, each in its "
                    "validation-chosen patch order",
                    _curve_value(variant, budget, f"{key.lower()}_concordance"), primary=True,
                ))  # fmt: skip
            exploratory.append(Endpoint(
                f"interpolation/{variant}/{budget} largest accuracy drop",
                "largest fall in test accuracy from one size to the next (0: never falls)",
                _curve_value(variant, budget, "largest_accuracy_drop"),
            ))  # fmt: skip
            exploratory.append(Endpoint(
                f"interpolation/{variant}/{budget} student gap",
                "test accuracy of the variant (k = M) minus its distilled student's (k = 0): what there is to "
                "interpolate (0: the student already matches it, and every concordance is about ties)",
                _curve_value(variant, budget, "student_gap"),
            ))  # fmt: skip
    return primary, exploratory


def _transfer_endpoints(settings: AdaptSettings) -> tuple[list[Endpoint], list[Endpoint]]:
    primary, exploratory = [], []
    for variant in settings.variants:
        for baseline in ("cross-patch", "distilled"):
            primary.append(Endpoint(
                f"transfer/{variant}/weight-delta - {baseline}",
                f"{variant}: test accuracy of ADAPT (weight-delta) minus {METHODS[baseline]}, mean over the sizes "
                f"below the variant ({settings.steps} steps)",
                _size_gap(variant, "weight-delta", baseline, "accuracy"), baseline=baseline, primary=True,
            ))  # fmt: skip
        for method in ("pretraining-delta", "sft-delta"):
            exploratory.append(Endpoint(
                f"transfer/{variant}/{method} - weight-delta",
                f"{variant}: test accuracy of {METHODS[method]} minus ADAPT (weight-delta), mean over the sizes "
                "below the variant (F.1)",
                _size_gap(variant, method, "weight-delta", "accuracy"), baseline="weight-delta",
            ))  # fmt: skip
        for method, baseline in (("weight-delta", "cross-patch"), ("weight-delta", "distilled"),
                                 ("pretraining-delta", "weight-delta"), ("sft-delta", "weight-delta")):  # fmt: skip
            exploratory.append(Endpoint(
                f"transfer/{variant}/{method} - {baseline} KL",
                f"{variant}: KL(variant ‖ model) of {method} minus {baseline}, mean over the sizes below the variant",
                _size_gap(variant, method, baseline, "kl"), baseline=baseline, higher_is_better=False,
            ))  # fmt: skip
        for phases in PHASES:
            exploratory.append(Endpoint(
                f"delta-cosine/{variant}/{phases}",
                f"cosine between the base's {phases} delta and {variant}'s own two-phase delta (App. G)",
                lambda record, v=variant, p=phases: [record["transfer"][v]["delta_cosine"][p]["cosine"]],
            ))  # fmt: skip
    return primary, exploratory


def _routing_endpoints(settings: AdaptSettings) -> tuple[list[Endpoint], list[Endpoint]]:
    primary, exploratory = [], []
    for method in ROUTED:
        for policy in ROUTING_POLICIES:
            metric = "accuracy" if policy == "average" else "minimum accuracy over lengths"
            primary.append(Endpoint(
                f"routing/{method}/{policy} gain at equal cost",
                f"{settings.routing_variant}'s {method} family, graded reversal: best routed ({policy} policy) "
                f"{metric} at no more cost than each fixed size, minus that size's, mean over the sizes",
                _routing_value(method, policy, "gain"), baseline="fixed size", primary=True,
            ))  # fmt: skip
            exploratory.append(Endpoint(
                f"routing/{method}/{policy} share of fixed sizes beaten",
                "share of fixed sizes with a routed point at most as costly and at least as accurate (one strictly)",
                _routing_value(method, policy, "dominated"),
            ))  # fmt: skip
    return primary, exploratory


STAGE_ENDPOINTS = {
    "interpolation": _interpolation_endpoints,
    "transfer": _transfer_endpoints,
    "routing": _routing_endpoints,
}


def declare_endpoints(settings: AdaptSettings) -> list[Endpoint]:
    """The stages' primary endpoints first (interpolation concordances, the transfer's accuracy gaps against
    cross-patch and direct distillation, the routing gains), then the exploratory ones."""
    declared = [STAGE_ENDPOINTS[stage](settings) for stage in STAGES if stage in settings.stages]
    return [e for primary, _ in declared for e in primary] + [e for _, exploratory in declared for e in exploratory]
