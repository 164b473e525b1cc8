"""adapt-frontier: does routing beat every random mix of fixed sizes, do sizes that differ in depth rise with it, is
it distillation that shapes the sizes, and is the transfer split the base student's answer format?

Version 3 (`adapt-controls`) compared routing with the best fixed size at no more cost (in 18 of 20 runs only the
smallest), patched a 3-layer student of unequal blocks (4, 3 and 1 layers: most sizes shared the student's depth),
had no student trained without distillation and no arm for its format reading of the transfer split. This version
(settings: `settings`; runs: `runs`):

- routes against the frontier of random mixes of the fixed sizes (`kinfolk.lab.methods.selection.mix_frontier`), the
  threshold chosen on calibration against the same frontier, its grid extended while the choice lies at an end;
- builds 12-layer teachers and a student of four equal blocks ({every: 3}), so sizes k = 0..3 have depths 4, 6, 8,
  10 (the variant, k = 4, 12), and counts concordance over pairs of distinct depth, its interval clipped to [0, 1];
- trains each variant's student a second time on cross-entropy alone (same rows, order, steps and schedule);
- teaches a second base student the same SFT problems in large_bracket's format: if the base student's format is what
  splits the transfer (v3: weight-delta − cross-patch −0.22 on large_instruct, +0.12 on large_bracket), the split
  turns over (large_instruct's gap positive, large_bracket's negative).

Choices, on validation only (`kinfolk.lab.methods.selection`): each size's patch order (higher validation accuracy;
ties back-to-front); the routing threshold on the calibration split (`frontier_threshold`). k = M (the variant) is
left out of every concordance and transfer mean; the middle size and the largest drop read the whole curve.

>>> [e.name for e in AdaptFrontier().primaries()][2:4]  # doctest: +NORMALIZE_WHITESPACE
['depth: accuracy concordance over distinct depths', 'distillation: middle size accuracy, distilled - ce-only']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kinfolk.lab.experiments.adapt_frontier.runs import AdaptFrontierRuns
from kinfolk.lab.experiments.adapt_frontier.settings import BASE_SFT_FORMATS, METHODS, FrontierSettings
from kinfolk.lab.methods.adapt.settings import ROUTED, largest_drop
from kinfolk.lab.methods.selection import (
    ROUTING_FRONTIER_RULE,
    chosen_orders,
    depth_concordance,
    frontier_threshold,
    routed_gain,
    routed_over_frontier,
)
from kinfolk.lab.protocol.experiment import ExploratoryEndpoint
from kinfolk.lab.protocol.family_runs import FamilyRunsExperiment
from kinfolk.lab.protocol.plan import PrimaryEndpoint
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.lab.protocol.views import SelectionView

INSTRUCT, BRACKET = "large_instruct", "large_bracket"
CONCORDANCE_RANGE = (0.0, 1.0)
CONCORDANCE_METHODS = ("distilled", "ce-only", "weight-delta")
# If the base student's answer format splits the transfer, the sign of weight-delta − cross-patch under each arm.
FORMAT_PREDICTION = {"preferred-sft": {INSTRUCT: "-", BRACKET: "+"}, "bracket-sft": {INSTRUCT: "+", BRACKET: "-"}}


def concordance_name(measure: str, variant: str | None = None, method: str = "distilled") -> str:
    where = "" if variant is None else f"/{variant}/{method}"
    return f"depth{where}: {measure} concordance over distinct depths"


class AdaptFrontier(FamilyRunsExperiment):
    name = "adapt-frontier"
    version = "4"
    settings_class = FrontierSettings
    family_runs_class = AdaptFrontierRuns

    def primaries(self) -> list[PrimaryEndpoint]:
        s = self.settings
        variants, skills = " and ".join(s.variants), " and ".join(s.scored)
        return [
            *(PrimaryEndpoint(
                f"routing/{method}: routed - random-mix frontier",
                f"{s.routing_variant}'s {method} family, graded reversal: test accuracy of the calibration-chosen "
                "routed assignment minus the best accuracy random mixes of two fixed sizes reach at no more expected "
                "test cost (the upper concave hull of the fixed sizes' test points, flat right of its most accurate "
                "vertex); undefined below the cheapest size's cost",
                "random mix of fixed sizes", "higher",
            ) for method in ROUTED),
            PrimaryEndpoint(
                concordance_name("accuracy"),
                f"share of pairs of sizes k < M of distinct depth whose deeper one has the higher test accuracy "
                f"({skills}, mean), ties 1/2; each variant's own distilled family (four equal blocks: depths "
                f"{', '.join(map(str, s.depths()[:-1]))}), mean over {variants}; t-interval clipped to [0, 1]",
                "no trend", "higher", 0.5,
            ),
            PrimaryEndpoint(
                "distillation: middle size accuracy, distilled - ce-only",
                "test accuracy of the middle size k = M // 2 of the variant's distilled student minus that of its "
                f"student trained on cross-entropy alone (same rows, order, steps, schedule), mean over {variants}",
                "ce-only", "higher",
            ),
            PrimaryEndpoint(
                "distillation: largest drop, ce-only - distilled",
                "largest fall of test accuracy from a size to the next smaller one (k = M down to 0) of the ce-only "
                f"student's sizes minus the distilled student's, mean over {variants}: positive when distillation "
                "leaves the smaller cliff",
                "ce-only", "higher",
            ),
            PrimaryEndpoint(
                "format: transfer split, bracket-sft - preferred-sft",
                "the transfer split (weight-delta - cross-patch test accuracy, mean over sizes k < M, on "
                "large_instruct minus on large_bracket) with the base student's SFT phase answering in "
                "large_bracket's format, minus the same with it answering in the preferred format (large_instruct's, "
                "version 3's): positive when the base student's answer format drives the split",
                "preferred-sft", "higher",
            ),
        ]  # fmt: skip

    def exploratory(self) -> list[ExploratoryEndpoint]:
        s = self.settings
        endpoints = [
            ExploratoryEndpoint(f"routing/{method}: routed - best fixed at no more cost",
                                "version 3's primary, for the same chosen routing", "best fixed size")
            for method in ROUTED
        ]  # fmt: skip
        endpoints.append(ExploratoryEndpoint(
            concordance_name("KL"), "as the primary for KL(variant || size), lower counting as better", "no trend",
            "higher", 0.5))  # fmt: skip
        for variant in s.variants:
            for method in CONCORDANCE_METHODS:
                endpoints.append(ExploratoryEndpoint(
                    concordance_name("accuracy", variant, method), "the primary's concordance, one family",
                    "no trend", "higher", 0.5))  # fmt: skip
            for student in ("distilled", "ce-only"):
                endpoints.append(ExploratoryEndpoint(
                    f"interpolation/{variant}/{student}: student gap",
                    "test accuracy of the variant (k = M) minus the student's (k = 0): what there is to interpolate",
                    "student"))  # fmt: skip
            endpoints += [
                ExploratoryEndpoint(f"distillation/{variant}: middle size accuracy, distilled - ce-only",
                                    "the primary, one variant", "ce-only"),
                ExploratoryEndpoint(f"distillation/{variant}: middle size KL, ce-only - distilled",
                                    "KL(variant || size) of the middle size", "ce-only"),
                ExploratoryEndpoint(f"distillation/{variant}: largest drop, ce-only - distilled",
                                    "the primary, one variant", "ce-only"),
            ]  # fmt: skip
            for arm in BASE_SFT_FORMATS:
                sign = FORMAT_PREDICTION[arm][variant]
                endpoints.append(ExploratoryEndpoint(
                    f"transfer/{variant}/{arm}: weight-delta - cross-patch",
                    f"test accuracy, mean over sizes k < M; the base student's SFT phase in {BASE_SFT_FORMATS[arm]}'s "
                    f"format; the format reading predicts {sign}", "cross-patch"))  # fmt: skip
            for method in ("weight-delta", "cross-patch"):
                endpoints.append(ExploratoryEndpoint(
                    f"format/{variant}/{method}: bracket-sft - preferred-sft",
                    "test accuracy, mean over sizes k < M, with the base student taught large_bracket's format "
                    "minus the preferred one", "preferred-sft"))  # fmt: skip
        return endpoints

    def selection_rules(self) -> dict[str, str]:
        s = self.settings
        return {
            "patch order": "per variant, method and size k, the order with the higher validation accuracy (mean "
            "over the scored skills); ties: back-to-front",
            "routing threshold": f"{ROUTING_FRONTIER_RULE}; grid 0 to 1 by {s.threshold_step}, extension bound "
            f"{s.threshold_extension} steps beyond each end",
        }

    def select(self, view: SelectionView) -> dict[str, Any]:
        s = self.settings
        return {
            "orders": {v: {m: chosen_orders(c) for m, c in methods.items()} for v, methods in view["curves"].items()},
            "routing": {method: frontier_threshold(view["routing"][method], s.threshold_step, s.threshold_extension)
                        for method in ROUTED},
        }  # fmt: skip

    def value_range(self, endpoint: str) -> tuple[float, float] | None:
        return CONCORDANCE_RANGE if "concordance" in endpoint else None

    def analyse(self, record: Mapping[str, Any], selection: dict[str, Any]) -> dict[str, EndpointValue]:
        s, values = self.settings, {}

        def curve(variant: str, method: str) -> list[dict[str, Any]]:
            """Every size k = 0..M in its chosen order."""
            orders = selection["orders"][variant][method]
            return [record["curves"][variant][method][order][k] for k, order in enumerate(orders)]

        def accuracy(variant: str, method: str) -> list[float]:
            return [size["test"]["accuracy"] for size in curve(variant, method)]

        def concordance(variant: str, method: str, measure: str) -> float | None:
            below = curve(variant, method)[:-1]  # k = M is the variant itself
            return depth_concordance([size["layers"] for size in below], [size["test"][measure] for size in below],
                                     higher_is_better=measure == "accuracy")  # fmt: skip

        def mean_over_variants(per_variant: list[float | None]) -> float | None:
            return None if None in per_variant else float(np.mean(per_variant))

        def transfer(variant: str, method: str) -> float:
            return float(np.mean(accuracy(variant, method)[:-1]))

        def difference(method: list[float], baseline: list[float], sign: float = 1.0) -> EndpointValue:
            """sign x (method - baseline), means over the lists, with both means beside it (sign -1 where lower is
            better: baseline - method)."""
            ours, theirs = float(np.mean(method)), float(np.mean(baseline))
            return EndpointValue(sign * (ours - theirs), ours, theirs)

        for method in ROUTED:
            routing, chosen = record["routing"][method], selection["routing"][method]
            values[f"routing/{method}: routed - random-mix frontier"] = routed_over_frontier(routing, chosen)
            best_fixed = routed_gain(routing, chosen["index"])
            values[f"routing/{method}: routed - best fixed at no more cost"] = EndpointValue(
                best_fixed.value, best_fixed.method, best_fixed.baseline, chosen["edge"]
            )
        for key, measure in (("accuracy", "accuracy"), ("KL", "kl")):
            values[concordance_name(key)] = EndpointValue(
                mean_over_variants([concordance(v, "distilled", measure) for v in s.variants])
            )
        middle, drop = {}, {}
        for variant in s.variants:
            for method in CONCORDANCE_METHODS:
                values[concordance_name("accuracy", variant, method)] = EndpointValue(
                    concordance(variant, method, "accuracy")
                )
            for student in ("distilled", "ce-only"):
                sizes = accuracy(variant, student)
                values[f"interpolation/{variant}/{student}: student gap"] = EndpointValue(
                    sizes[-1] - sizes[0], sizes[-1], sizes[0]
                )
            distilled, ce_only = accuracy(variant, "distilled"), accuracy(variant, "ce-only")
            k = (len(distilled) - 1) // 2
            middle[variant] = (distilled[k], ce_only[k])
            drop[variant] = (largest_drop(distilled[::-1]), largest_drop(ce_only[::-1]))  # from k = M down
            values[f"distillation/{variant}: middle size accuracy, distilled - ce-only"] = difference(
                [distilled[k]], [ce_only[k]]
            )
            kl = [curve(variant, student)[k]["test"]["kl"] for student in ("distilled", "ce-only")]
            values[f"distillation/{variant}: middle size KL, ce-only - distilled"] = difference([kl[0]], [kl[1]], -1)
            values[f"distillation/{variant}: largest drop, ce-only - distilled"] = difference(
                [drop[variant][0]], [drop[variant][1]], -1
            )
            for arm in BASE_SFT_FORMATS:
                suffix = "" if arm == "preferred-sft" else f"/{arm}"
                values[f"transfer/{variant}/{arm}: weight-delta - cross-patch"] = difference(
                    [transfer(variant, f"weight-delta{suffix}")], [transfer(variant, f"cross-patch{suffix}")]
                )
            for method in ("weight-delta", "cross-patch"):
                values[f"format/{variant}/{method}: bracket-sft - preferred-sft"] = difference(
                    [transfer(variant, f"{method}/bracket-sft")], [transfer(variant, method)]
                )
        values["distillation: middle size accuracy, distilled - ce-only"] = difference(
            [middle[v][0] for v in s.variants], [middle[v][1] for v in s.variants]
        )
        values["distillation: largest drop, ce-only - distilled"] = difference(
            [drop[v][0] for v in s.variants], [drop[v][1] for v in s.variants], -1
        )
        split = {arm: values[f"transfer/{INSTRUCT}/{arm}: weight-delta - cross-patch"].value
                 - values[f"transfer/{BRACKET}/{arm}: weight-delta - cross-patch"].value
                 for arm in BASE_SFT_FORMATS}  # fmt: skip
        values["format: transfer split, bracket-sft - preferred-sft"] = EndpointValue(
            split["bracket-sft"] - split["preferred-sft"], split["bracket-sft"], split["preferred-sft"]
        )
        return values

    def plan_fields(self) -> dict[str, Any]:
        s = self.settings
        depths = ", ".join(map(str, s.depths()))
        return {
            "notes": [
                "Version 4 of the ADAPT question: new runs on ADAPT families 0-4 rebuilt with a "
                f"{s.teacher_layers}-layer teacher (LAB_VERSION 4, fp32; hidden and intermediate sizes as versions "
                "1-3's 8-layer teacher), two distillation seeds per family; versions 1-3 stay as they are. Written "
                "after version 3's results and an audit of its records were seen (issue 39).",
                f"Methods: {'; '.join(f'{m}: {d}' for m, d in METHODS.items())}.",
                f"Depth: the student {s.layers} keeps teacher layers 0, 3, 6, 9, four blocks of 3 layers, so size k "
                f"has depth {depths} for k = 0..4 in either patch order and every pair of sizes k < M differs in "
                "depth (versions 1-3: {every: 4, last: 1} of 8 layers, blocks of 4, 3 and 1). The concordance "
                "still counts pairs of distinct depth only. Its t-interval is clipped to [0, 1], not replaced: the "
                "results give `range`, `ci95_unclipped` and `ci95_clipped` beside it; the t-test is unchanged.",
                "Routing is held against the frontier of random mixes of the fixed sizes: at a cost c, the best "
                "accuracy a random mix of two fixed sizes reaches at an expected cost of at most c, i.e. the upper "
                "concave hull of the fixed sizes' (cost, accuracy) points (kinfolk.plugins.adapt.hull, the one "
                "`kinfolk route` reports) held flat right of its most accurate vertex; undefined below the cheapest "
                "size's cost. The threshold is chosen on the calibration split against the calibration frontier.",
                "Threshold grid: every run routes at -0.1 to 1.1 by 0.02; the choice starts on 0 to 1, and an end "
                "it lies at is extended one step at a time, at most 5 steps. For both policies a threshold above 1 "
                "gives the assignment of threshold 1 (nothing clears it: the most accurate assignment, as at 1 when "
                "no assignment is perfect) and one below 0 that of 0 (the cheapest), so a choice at 1 or 0 stays "
                "at the end of the extended grid and is flagged: it means the calibration's best routing is the "
                "most accurate (or cheapest) one, not that the grid was too small. Version 3's comparison (routed "
                "minus the best fixed size at no more cost) is exploratory.",
                "The ce-only student is `kinfolk distil`'s recipe with kl_weight 0 and cosine_weight 0, every other "
                "field of its config the distilled student's (tests/test_lab_adapt_frontier.py checks it): the same "
                "rows, order, steps, schedule and learning rate. Middle size: k = M // 2 = 2 (depth 8).",
                "The format arm: a second base student distilled on the same disjoint SFT problems with their "
                "answers in large_bracket's format ([...]); weight-delta and cross-patch from it on both variants. "
                "If the format the base student is taught is what splits version 3's transfer (weight-delta minus "
                "cross-patch -0.22 on large_instruct, +0.12 on large_bracket), then with the bracket-taught base "
                "student the gap turns positive on large_instruct and negative on large_bracket (exploratory "
                "transfer/<variant>/bracket-sft), and the primary (the split with bracket-sft minus with "
                "preferred-sft) is positive, near twice version 3's split (+0.34) if the format explains all of "
                "it; near 0 if the format plays no part.",
                "Pilot before this plan, on family 1 (its 12-layer build, which the runs reuse: every threshold "
                "passed, large base pre-trained 750 steps) with distillation seed 999 (not a plan seed), "
                "large_instruct's students only, measured as the plan measures: the distilled student at 150, 100, "
                "75 and 50 steps had validation accuracy 0.995, 0.988, 0.925 and 0.780 against the variant's 0.998 "
                "(test 1.000, 0.990, 0.927, 0.827 against 1.000); the ce-only student 0.807, 0.873, 0.113 and "
                "0.015. The plan takes 50 steps, by version 3's rule: the longest budget tried at which the student "
                "still trailed by more than 0.1. At 50 steps plain training has not yet learned the skills, so the "
                "ce-only comparison asks what distillation gives the sizes at a budget plain training cannot use.",
                "Those pilot curves were seen: at 50-150 steps the distilled sizes did not rise with depth "
                "(at 50 steps, test accuracy of k = 0..3 back to front 0.83, 0.74, 0.68, 0.72, front to back 0.83, "
                "0.60, 0.69, 1.00); the ce-only sizes front to back rose (0.03, 0.25, 0.53, 1.00); at k = 0 "
                "weight-delta scored 0.06 and cross-patch 0.76; routing beat the frontier on the pilot's test "
                "split by +0.12 (distilled) and +0.26 (weight-delta), neither choice at a grid edge. They were made "
                "in a scratch folder and are not among the plan's runs.",
                "Timing of the pilot (one process at nice 19 beside other jobs on two cores): the 12-layer family "
                "build 1374 s (large base 1125 s); a 50-step distillation about 20 s (75 steps 30 s, 150 steps "
                "38 s); one curve (2 orders x 5 sizes) measured in 25-30 s; routing's graded outcomes of both "
                "routed families about 20 s. A run has 6 distillations and 12 curves: about 8 minutes.",
            ]
        }
