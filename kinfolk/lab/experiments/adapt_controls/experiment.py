"""adapt-controls: is ADAPT's transfer more than the base student having read the variant's own data, and do its
sizes interpolate when the student has something left to learn?

Version 1 distilled the base student's SFT phase on large_instruct's own post-training rows (close to circular for
that variant) and scored copy and reversal, where the 5-layer student matched its teacher from 100 steps on. This
version (settings: `settings`; runs: `runs`) gives the base student a corpus disjoint from every variant's
post-training prompts (`kinfolk.lab.methods.adapt.base_corpus`), distils a 3-layer student for 150 steps (where the
pilot's student still trailed its teacher on reversal and graded reversal of 2-6 letters, the skills scored), runs
two distillation seeds per family and keeps version 1's corpus as an exploratory arm (weight-delta-circular).

Choices, on validation only (`kinfolk.lab.methods.selection`): each size's patch order (higher validation accuracy;
ties back-to-front); the routing threshold on the calibration split. Size is depth; k = M (the variant) is left out
of every mean and concordance.

>>> [e.name for e in AdaptControls().primaries()][:3]  # doctest: +NORMALIZE_WHITESPACE
['interpolation: accuracy concordance with depth', 'interpolation: KL concordance with depth',
 'transfer/large_instruct: weight-delta - cross-patch']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kinfolk.lab.experiments.adapt_controls.runs import AdaptControlsRuns
from kinfolk.lab.experiments.adapt_controls.settings import METHODS, ControlsSettings
from kinfolk.lab.methods.adapt.settings import ROUTED
from kinfolk.lab.methods.selection import (
    ROUTING_THRESHOLD_RULE,
    chosen_orders,
    chosen_sizes,
    chosen_threshold,
    depth_concordance,
    routed_gain,
)
from kinfolk.lab.protocol.experiment import ExploratoryEndpoint
from kinfolk.lab.protocol.family_runs import FamilyRunsExperiment
from kinfolk.lab.protocol.plan import PrimaryEndpoint
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.lab.protocol.views import SelectionView


class AdaptControls(FamilyRunsExperiment):
    name = "adapt-controls"
    version = "3"
    settings_class = ControlsSettings
    family_runs_class = AdaptControlsRuns

    def primaries(self) -> list[PrimaryEndpoint]:
        s = self.settings
        variants, skills = " and ".join(s.variants), " and ".join(s.scored)
        return [
            PrimaryEndpoint(
                "interpolation: accuracy concordance with depth",
                "share of pairs of sizes k < M of different depth whose deeper one has the higher test accuracy "
                f"({skills}, mean), ties 1/2; each variant's own distilled family, mean over {variants}",
                "no trend", "higher", 0.5,
            ),
            PrimaryEndpoint(
                "interpolation: KL concordance with depth",
                "as above for KL(variant || size) per response token, lower counting as better",
                "no trend", "higher", 0.5,
            ),
            *(PrimaryEndpoint(
                f"transfer/{variant}: weight-delta - cross-patch",
                f"{variant}: test accuracy of ADAPT (weight-delta: its init + the base's delta, the base's SFT phase "
                "on a corpus disjoint from every variant's post-training prompts) minus cross-patching its blocks "
                "into that base student, mean over sizes k < M",
                "cross-patch", "higher",
            ) for variant in s.variants),
            *(PrimaryEndpoint(
                f"routing/{method}: routed - best fixed at no more cost",
                f"{s.routing_variant}'s {method} family, graded reversal: test accuracy of the calibration-chosen "
                "routed assignment minus the most accurate fixed size whose test cost is no higher",
                "best fixed size", "higher",
            ) for method in ROUTED),
        ]  # fmt: skip

    def exploratory(self) -> list[ExploratoryEndpoint]:
        s, endpoints = self.settings, []
        for variant in s.variants:
            endpoints.append(ExploratoryEndpoint(
                f"interpolation/{variant}: student gap",
                f"{variant}: test accuracy of the variant (k = M) minus its distilled student's (k = 0): what there "
                "is to interpolate", "student"))  # fmt: skip
            for skill in s.scored:
                endpoints.append(ExploratoryEndpoint(
                    f"interpolation/{variant}: student gap on {skill}", "as above, one skill", "student"))  # fmt: skip
            for key in ("accuracy", "KL"):
                endpoints.append(ExploratoryEndpoint(
                    f"interpolation/{variant}/weight-delta: {key} concordance with depth",
                    "the primary's concordance over the weight-delta family", "no trend", "higher", 0.5))  # fmt: skip
            endpoints.append(ExploratoryEndpoint(
                f"transfer/{variant}: weight-delta - distilled",
                "test accuracy of weight-delta minus the variant's own distilled family, mean over sizes k < M",
                "distilled"))  # fmt: skip
            endpoints.append(ExploratoryEndpoint(
                f"transfer/{variant}: weight-delta - cross-patch, KL",
                "KL(variant || size) of weight-delta minus cross-patch, mean over sizes k < M", "cross-patch",
                "lower"))  # fmt: skip
            if s.circular_arm:
                endpoints.append(ExploratoryEndpoint(
                    f"transfer/{variant}: weight-delta-circular - weight-delta",
                    "test accuracy with the base's SFT phase on large_instruct's own post-training rows (version "
                    "1's corpus) minus on the disjoint corpus, mean over sizes k < M: what the circular corpus "
                    "added", "weight-delta"))  # fmt: skip
        return endpoints

    def selection_rules(self) -> dict[str, str]:
        return {
            "patch order": "per variant, method and size k, the order with the higher validation accuracy (mean "
            "over the scored skills); ties: back-to-front",
            "routing threshold": ROUTING_THRESHOLD_RULE,
        }

    def select(self, view: SelectionView) -> dict[str, Any]:
        return {
            "orders": {v: {m: chosen_orders(c) for m, c in methods.items()} for v, methods in view["curves"].items()},
            "routing": {method: chosen_threshold(view["routing"][method]) for method in ROUTED},
        }

    def analyse(self, record: Mapping[str, Any], selection: dict[str, Any]) -> dict[str, EndpointValue]:
        s, values = self.settings, {}

        def sizes(variant: str, method: str) -> list[dict[str, Any]]:
            return chosen_sizes(record["curves"][variant][method], selection["orders"][variant][method])

        def concordance(variant: str, method: str, key: str) -> float | None:
            chosen, measure = sizes(variant, method), key.lower()  # "accuracy" rises with depth, "kl" falls
            values = [c["test"][measure] for c in chosen]
            return depth_concordance([c["layers"] for c in chosen], values, higher_is_better=measure == "accuracy")

        def gap(variant: str, method: str, baseline: str, key: str = "accuracy") -> EndpointValue:
            ours = float(np.mean([c["test"][key] for c in sizes(variant, method)]))
            theirs = float(np.mean([c["test"][key] for c in sizes(variant, baseline)]))
            return EndpointValue(ours - theirs, ours, theirs)

        for key in ("accuracy", "KL"):
            per_variant = [concordance(v, "distilled", key) for v in s.variants]
            mean = None if None in per_variant else float(np.mean(per_variant))
            values[f"interpolation: {key} concordance with depth"] = EndpointValue(mean)
            for variant in s.variants:
                name = f"interpolation/{variant}/weight-delta: {key} concordance with depth"
                values[name] = EndpointValue(concordance(variant, "weight-delta", key))
        for variant in s.variants:
            values[f"transfer/{variant}: weight-delta - cross-patch"] = gap(variant, "weight-delta", "cross-patch")
            values[f"transfer/{variant}: weight-delta - distilled"] = gap(variant, "weight-delta", "distilled")
            values[f"transfer/{variant}: weight-delta - cross-patch, KL"] = gap(
                variant, "weight-delta", "cross-patch", "kl"
            )
            if s.circular_arm:
                values[f"transfer/{variant}: weight-delta-circular - weight-delta"] = gap(
                    variant, "weight-delta-circular", "weight-delta"
                )
            curve, orders = record["curves"][variant]["distilled"], selection["orders"][variant]["distilled"]
            student, full = curve[orders[0]][0]["test"], curve[orders[-1]][-1]["test"]
            values[f"interpolation/{variant}: student gap"] = EndpointValue(
                full["accuracy"] - student["accuracy"], full["accuracy"], student["accuracy"]
            )
            for skill in s.scored:
                values[f"interpolation/{variant}: student gap on {skill}"] = EndpointValue(
                    full["skills"][skill] - student["skills"][skill], full["skills"][skill], student["skills"][skill]
                )
        for method in ROUTED:
            name = f"routing/{method}: routed - best fixed at no more cost"
            values[name] = routed_gain(record["routing"][method], selection["routing"][method])
        return values

    def plan_fields(self) -> dict[str, Any]:
        return {
            "notes": [
                "Version 3 of the ADAPT question: new runs on LAB_VERSION 4 (fp32) ADAPT families 0-4 (8-layer teacher, "
                "graded reversal in pre- and post-training), two distillation seeds per family; version 2 (the "
                "re-analysis of version 1's runs) stays as it was. Written after version 2's results were seen, on a "
                "review's request (issue 25).",
                f"Methods: {'; '.join(f'{m}: {d}' for m, d in METHODS.items())}.",
                "Base corpus: its own generator stream, every prompt of either variant's post-training rows removed "
                "(tests/test_lab_adapt_controls.py); each record states the share of the base's SFT prompts that are "
                "a variant's (0 for the disjoint corpus; 1 for the circular one on large_instruct).",
                "Pilot before this plan, on family 1 with distillation seed 999 (not a plan seed), large_instruct's "
                "own student only, scored on reverse and graded reversal: the 5-layer student of versions 1-2 "
                "({every: 2, last: 1}) at 300 steps matched its teacher (1.00 every size but two patched ones); "
                "{every: 2} (4 layers) at 150 steps 1.00; {every: 3} at 100 and 150 steps 0.95 and 0.98; "
                "{every: 4, last: 1} (3 layers) at 100, 150 and 300 steps 0.27, 0.83 (graded reversal 0.67) and "
                "1.00. The plan takes the 3-layer student at 150 steps: the longest budget tried at which the "
                "student still trailed by more than 0.1. The skill is not harder than version 1's (no family with "
                "longer reversals was built): the student trails because it is smaller and trained for fewer steps.",
                "Those pilot curves were seen (front-to-back sizes rose with depth; back-to-front's k = 2 answered "
                "nothing); they were made in a scratch folder and are not among the plan's runs. Timing there: a "
                "150-step distillation 45 s, the 8 sizes of one curve measured in 9 s, beside two other jobs.",
            ]
        }
