"""ADAPT re-analysed under protocol 2: does patching blocks interpolate between student and variant, does
weight-delta transfer beat its controls, and does routing beat the best fixed size at no more cost?

The committed runs (`docs/results/adapt-families/`, one run per family) hold, for every size k = 0..M (k blocks
of the variant patched into the student) and patch order, its depth (layers), validation accuracy and test
accuracy and KL(variant ‖ model); for routing, a calibration split's accuracy and cost per difficulty level and
size, and test results of every fixed size and every distinct routed assignment of the threshold grid.

Selection sees validation and calibration only: each size's patch order is the one with the higher validation
accuracy (ties: back-to-front, the first in name order); the routing threshold is the one whose assignment, on
calibration, gains most over the best fixed size at no more calibration cost (ties: lower calibration cost).

The selection rules and the depth concordance are `kinfolk.lab.methods.selection`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kinfolk.lab.methods.adapt.settings import ROUTED
from kinfolk.lab.methods.selection import (
    ROUTING_THRESHOLD_RULE,
    chosen_orders,
    chosen_sizes,
    chosen_threshold,
    curve_sizes,
    depth_concordance,
    routed_gain,
    routing_record,
)
from kinfolk.lab.protocol.experiment import ExploratoryEndpoint
from kinfolk.lab.protocol.plan import PrimaryEndpoint
from kinfolk.lab.protocol.reanalysis import Reanalysis
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.lab.protocol.views import SelectionView


@dataclass(frozen=True)
class AdaptReanalysisSettings:
    """What the re-analysis compares."""

    variants: list[str] = field(default_factory=lambda: ["large_instruct", "large_bracket"],
                                metadata={"help": "Post-trained variants (per-family values average over them)."})  # fmt: skip
    budget: int = field(default=300, metadata={"help": "Distillation steps of the primary interpolation curves."})
    other_budgets: list[int] = field(default_factory=lambda: [30, 100, 1000],
                                     metadata={"help": "Budgets added after the 300-step runs were seen."})  # fmt: skip
    routing_policy: str = field(default="average", metadata={"help": "Routing policy of the primaries."})


class AdaptReanalysis(Reanalysis):
    name = "adapt"
    version = "2-reanalysis"
    settings_class = AdaptReanalysisSettings
    records_dir = "adapt-families"
    runs_commit = "491cdac22c6407d4c63b5a53179bfc1f67a9a173"
    notes = (
        "Re-analysis of version-1 runs whose results had been seen; this plan was written afterwards, so its choice "
        "of primaries is not blind. The 30-, 100- and 1000-step budgets were added after the 300-step runs had "
        "been seen: they are exploratory.",
        "One run per family: the two-stage cluster bootstrap reduces to a bootstrap over families.",
        "Routing: every fixed size and routed assignment has test accuracy and cost, and the calibration split has "
        "accuracy and cost per level and size, so the threshold is chosen on calibration and judged on test.",
        "Trained at LAB_VERSION 3, under TRL's default bf16=True (CPU bf16 autocast) in lab_trainer.",
    )

    def primaries(self) -> list[PrimaryEndpoint]:
        variants = " and ".join(self.settings.variants)
        budget = self.settings.budget
        return [
            PrimaryEndpoint("interpolation: accuracy concordance with depth",
                            f"share of pairs of sizes of different depth (k < M) whose deeper one has the higher "
                            f"test accuracy, ties 1/2; {budget}-step students; mean over {variants}",
                            baseline="no trend", direction="higher", null=0.5),
            PrimaryEndpoint("interpolation: KL concordance with depth",
                            "as above for KL(variant ‖ model), lower counting as better; k = M left out",
                            baseline="no trend", direction="higher", null=0.5),
            PrimaryEndpoint("transfer: weight-delta - cross-patch",
                            "test accuracy of ADAPT (weight-delta) minus cross-patching, mean over sizes k < M and "
                            f"over {variants}", baseline="cross-patch", direction="higher"),
            PrimaryEndpoint("transfer: weight-delta - distilled",
                            "test accuracy of ADAPT (weight-delta) minus the directly distilled family, mean over "
                            f"sizes k < M and over {variants}", baseline="distilled", direction="higher"),
            *(PrimaryEndpoint(f"routing/{method}: routed - best fixed at no more cost",
                              f"{method} family, graded reversal: test accuracy of the calibration-chosen routed "
                              "assignment minus the most accurate fixed size whose test cost is no higher",
                              baseline="best fixed size", direction="higher")
              for method in ROUTED),
        ]  # fmt: skip

    def exploratory(self) -> list[ExploratoryEndpoint]:
        endpoints = []
        for budget in self.settings.other_budgets:
            for key in ("accuracy", "KL"):
                endpoints.append(ExploratoryEndpoint(
                    f"interpolation/{budget}: {key} concordance with depth",
                    f"as the primary, {budget}-step students (budget added after the 300-step results)",
                    "no trend", "higher", 0.5,
                ))  # fmt: skip
        for variant in self.settings.variants:
            endpoints.append(ExploratoryEndpoint(
                f"interpolation/{variant}: student gap",
                f"{variant}: test accuracy of the variant (k = M) minus its {self.settings.budget}-step student's "
                "(k = 0): how much there is to interpolate", "student",
            ))  # fmt: skip
        return endpoints

    def selection_rules(self) -> dict[str, str]:
        return {
            "patch order": "per curve and size k, the order with the higher validation accuracy; ties: back-to-front",
            "routing threshold": ROUTING_THRESHOLD_RULE,
        }

    def split_record(self, committed: dict[str, Any], run: int) -> dict[str, Any]:
        return {
            "interpolation": {v: {str(b): curve_sizes(c) for b, c in committed["interpolation"][v].items()}
                              for v in self.settings.variants},
            "transfer": {v: {m: curve_sizes(c) for m, c in committed["transfer"][v]["curves"].items()}
                         for v in self.settings.variants},
            "routing": {m: routing_record(committed["routing"][m], self.settings.routing_policy) for m in ROUTED},
        }  # fmt: skip

    def select(self, view: SelectionView) -> dict[str, Any]:
        chosen: dict[str, Any] = {"interpolation": {}, "transfer": {}, "routing": {}}
        for variant in self.settings.variants:
            chosen["interpolation"][variant] = {b: chosen_orders(c) for b, c in view["interpolation"][variant].items()}
            chosen["transfer"][variant] = {m: chosen_orders(c) for m, c in view["transfer"][variant].items()}
        for method in ROUTED:
            chosen["routing"][method] = chosen_threshold(view["routing"][method])
        return chosen

    def analyse(self, record: Mapping[str, Any], selection: dict[str, Any]) -> dict[str, EndpointValue]:
        def concordances(budget: int) -> dict[str, float | None]:
            out: dict[str, list[float | None]] = {"accuracy": [], "KL": []}
            for variant in self.settings.variants:
                sizes = chosen_sizes(record["interpolation"][variant][str(budget)],
                                     selection["interpolation"][variant][str(budget)])  # fmt: skip
                depths = [s["layers"] for s in sizes]
                out["accuracy"].append(depth_concordance(depths, [s["test"]["accuracy"] for s in sizes]))
                out["KL"].append(depth_concordance(depths, [s["test"]["kl"] for s in sizes], higher_is_better=False))
            return {key: None if None in v else float(np.mean(v)) for key, v in out.items()}

        values: dict[str, EndpointValue] = {}
        primary = concordances(self.settings.budget)
        values["interpolation: accuracy concordance with depth"] = EndpointValue(primary["accuracy"])
        values["interpolation: KL concordance with depth"] = EndpointValue(primary["KL"])
        for budget in self.settings.other_budgets:
            other = concordances(budget)
            for key in ("accuracy", "KL"):
                values[f"interpolation/{budget}: {key} concordance with depth"] = EndpointValue(other[key])
        for baseline in ("cross-patch", "distilled"):
            ours, theirs = [], []
            for variant in self.settings.variants:
                curves, orders = record["transfer"][variant], selection["transfer"][variant]
                ours += [s["test"]["accuracy"] for s in chosen_sizes(curves["weight-delta"], orders["weight-delta"])]
                theirs += [s["test"]["accuracy"] for s in chosen_sizes(curves[baseline], orders[baseline])]
            mine, other = float(np.mean(ours)), float(np.mean(theirs))
            values[f"transfer: weight-delta - {baseline}"] = EndpointValue(mine - other, mine, other)
        for method in ROUTED:
            name = f"routing/{method}: routed - best fixed at no more cost"
            values[name] = routed_gain(record["routing"][method], selection["routing"][method])
        for variant in self.settings.variants:
            curve = record["interpolation"][variant][str(self.settings.budget)]
            orders = selection["interpolation"][variant][str(self.settings.budget)]
            sizes = [curve[order][k] for k, order in enumerate(orders)]
            student, full = sizes[0]["test"]["accuracy"], sizes[-1]["test"]["accuracy"]
            values[f"interpolation/{variant}: student gap"] = EndpointValue(full - student, full, student)
        return values
