"""adapt-compute: does distillation give better patched sizes than cross-entropy alone at equal training compute, and
than a cross-entropy student trained until its validation accuracy stops improving?

Version 4 (`adapt-frontier`) compared them at 50 equal steps, where a distillation step costs about twice a
cross-entropy step (the teacher's forward) and plain cross-entropy had barely learned (its pilot: 0.015 validation
accuracy at 50 steps, 0.873 at 100, against the distilled student's 0.780 at 50). This version (settings:
`settings`; runs: `runs`) keeps version 4's families, 12-layer teachers, 4-block student and 50-step distillation,
and trains each variant's student on cross-entropy alone three ways: at 50 steps (version 4's arm, exploratory), at
the distilled student's training FLOPs (`settings.equal_flops_steps`: 100 steps) and up a budget ladder until its
validation accuracy stops improving (`kinfolk.lab.methods.compute.converged_budget`). The depth question is not asked: in every size
depth, the number of teacher blocks and the parameter count rise together, so it is not identifiable here.

Choices, on validation only: each size's patch order (higher validation accuracy; ties back-to-front) and the
converged budget (re-derived from the ladder's validation accuracies). The middle size is k = M // 2 and the largest
drop reads the whole curve from k = M down.

>>> [e.name for e in AdaptCompute().primaries()][:2]  # doctest: +NORMALIZE_WHITESPACE
['equal FLOPs: middle size accuracy, distilled - ce-only', 'equal FLOPs: largest drop, ce-only - distilled']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kinfolk.lab.experiments.adapt_compute.runs import ARMS, AdaptComputeRuns
from kinfolk.lab.experiments.adapt_compute.settings import ComputeSettings
from kinfolk.lab.methods.adapt.settings import largest_drop
from kinfolk.lab.methods.compute import converged_budget, step_flops
from kinfolk.lab.methods.selection import chosen_orders
from kinfolk.lab.protocol.experiment import ExploratoryEndpoint
from kinfolk.lab.protocol.family_runs import FamilyRunsExperiment
from kinfolk.lab.protocol.plan import CLAIMS_SCHEMA, Claim, PrimaryEndpoint
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.lab.protocol.views import SelectionView

# The compared cross-entropy arm of each comparison, and how its budget is read in the endpoints' names.
COMPARISONS = {
    "equal FLOPs": "ce-only/equal-flops",
    "converged": "ce-only/converged",
    "equal steps": "ce-only/equal-steps",
}
PRIMARY_COMPARISONS = ("equal FLOPs", "converged")
NOT_SIGNIFICANT = "not significant after Holm's correction"


def middle_name(comparison: str, variant: str | None = None) -> str:
    return f"{comparison}{'' if variant is None else f'/{variant}'}: middle size accuracy, distilled - ce-only"


def drop_name(comparison: str, variant: str | None = None) -> str:
    return f"{comparison}{'' if variant is None else f'/{variant}'}: largest drop, ce-only - distilled"


class AdaptCompute(FamilyRunsExperiment):
    name = "adapt-compute"
    version = "5"
    settings_class = ComputeSettings
    family_runs_class = AdaptComputeRuns

    def scopes(self) -> dict[str, str]:
        """Where each primary comparison is measured, said word for word by its claim's sentences."""
        s = self.settings
        families = f"in the lab's {len(s.families)} families (12-layer teachers, {len(s.blocks())}-block students)"
        return {
            "equal FLOPs": f"{families} at equal training FLOPs ({s.steps} distilled steps against "
            f"{s.equal_flops_steps} cross-entropy steps, the teacher's forward counted)",
            "converged": f"{families} against a cross-entropy student trained until its validation accuracy stopped "
            f"improving (up to {max(s.ce_budgets)} steps), the distilled student at {s.steps} steps",
        }

    def claims(self, comparison: str) -> tuple[Claim, Claim]:
        """The middle size's and the largest drop's claims for one comparison, fixed with the plan."""
        scope = self.scopes()[comparison]
        ce = "cross-entropy alone"  # the scope says at which budget
        middle = Claim(
            scope,
            f"At the middle size the distilled student was more accurate than one trained on {ce}, {scope}.",
            f"At the middle size, distilled against {ce}: {NOT_SIGNIFICANT}, {scope}.",
            f"At the middle size a student trained on {ce} was more accurate than the distilled one, {scope}.",
        )
        drop = Claim(
            scope,
            f"Distillation left a smaller largest drop in accuracy between sizes than training on {ce}, {scope}.",
            f"The largest drop between sizes, {ce} against distilled: {NOT_SIGNIFICANT}, {scope}.",
            f"Training on {ce} left a smaller largest drop between sizes than distillation, {scope}.",
        )
        return middle, drop

    def primaries(self) -> list[PrimaryEndpoint]:
        s = self.settings
        variants = " and ".join(s.variants)
        budget = {
            "equal FLOPs": f"trained {s.equal_flops_steps} steps, the FLOPs of the distilled student's {s.steps} "
            "(6 N_student per token per cross-entropy step, 6 N_student + 2 N_teacher per distillation step)",
            "converged": "trained at the budget of its ladder where its unpatched student's validation accuracy "
            f"stopped improving (by more than {s.stop_tolerance}; budgets {', '.join(map(str, s.ce_budgets))})",
        }
        endpoints = []
        for comparison in PRIMARY_COMPARISONS:
            middle, drop = self.claims(comparison)
            endpoints += [
                PrimaryEndpoint(
                    middle_name(comparison),
                    f"test accuracy of the middle size k = M // 2 of the variant's distilled student ({s.steps} steps) "
                    f"minus that of its student on cross-entropy alone (same rows, order and learning rate), "
                    f"{budget[comparison]}; mean over {variants}",
                    "ce-only", "higher", claim=middle,
                ),
                PrimaryEndpoint(
                    drop_name(comparison),
                    "largest fall of test accuracy from a size to the next smaller one (k = M down to 0) of the "
                    f"cross-entropy student's sizes ({comparison}, as in the middle size's endpoint) minus the "
                    f"distilled student's, mean over {variants}: positive when distillation leaves the smaller cliff",
                    "ce-only", "higher", claim=drop,
                ),
            ]  # fmt: skip
        return endpoints

    def exploratory(self) -> list[ExploratoryEndpoint]:
        s = self.settings
        endpoints = [
            ExploratoryEndpoint(middle_name("equal steps"), "version 4's primary, on this version's runs", "ce-only"),
            ExploratoryEndpoint(drop_name("equal steps"), "version 4's primary, on this version's runs", "ce-only"),
            ExploratoryEndpoint(
                "converged: training FLOPs, ce-only / distilled",
                "the converged cross-entropy student's training FLOPs over the distilled student's (mean over "
                "variants): how much more compute plain training took to stop improving", "distilled",
            ),
        ]  # fmt: skip
        for variant in s.variants:
            for comparison in COMPARISONS:
                endpoints += [
                    ExploratoryEndpoint(middle_name(comparison, variant), "the comparison, one variant", "ce-only"),
                    ExploratoryEndpoint(drop_name(comparison, variant), "the comparison, one variant", "ce-only"),
                ]
            endpoints.append(ExploratoryEndpoint(
                f"converged/{variant}: cross-entropy steps", "the converged budget, against the distilled steps",
                "distilled"))  # fmt: skip
        return endpoints

    def selection_rules(self) -> dict[str, str]:
        s = self.settings
        return {
            "patch order": "per variant, arm and size k, the order with the higher validation accuracy (mean over the "
            "scored skills); ties: back-to-front",
            "converged budget": f"per variant, climbing the budgets {', '.join(map(str, s.ce_budgets))}: the budget "
            "with the best validation accuracy of the unpatched cross-entropy student before the first budget that "
            f"does not beat it by more than {s.stop_tolerance}; the last budget (flagged as a grid edge) if every "
            "one does",
        }

    def select(self, view: SelectionView) -> dict[str, Any]:
        s = self.settings
        converged = {
            variant: converged_budget([(rung["steps"], rung["validation"]) for rung in ladder], s.stop_tolerance)
            for variant, ladder in view["ladder"].items()
        }
        return {
            "orders": {v: {arm: chosen_orders(c) for arm, c in arms.items()} for v, arms in view["curves"].items()},
            "converged": {variant: {"steps": steps, "edge": edge} for variant, (steps, edge) in converged.items()},
        }

    def analyse(self, record: Mapping[str, Any], selection: dict[str, Any]) -> dict[str, EndpointValue]:
        s, values = self.settings, {}

        def accuracy(variant: str, arm: str) -> list[float]:
            orders = selection["orders"][variant][arm]
            return [record["curves"][variant][arm][order][k]["test"]["accuracy"] for k, order in enumerate(orders)]

        def difference(method: list[float], baseline: list[float], sign: float = 1.0, edge: bool = False):
            ours, theirs = float(np.mean(method)), float(np.mean(baseline))
            return EndpointValue(sign * (ours - theirs), ours, theirs, edge)

        middle: dict[str, list[tuple[float, float]]] = {c: [] for c in COMPARISONS}
        drop: dict[str, list[tuple[float, float]]] = {c: [] for c in COMPARISONS}
        edge = any(selection["converged"][v]["edge"] for v in s.variants)
        for variant in s.variants:
            distilled = accuracy(variant, "distilled")
            k = (len(distilled) - 1) // 2
            for comparison, arm in COMPARISONS.items():
                ce_only = accuracy(variant, arm)
                flagged = comparison == "converged" and selection["converged"][variant]["edge"]
                middle[comparison].append((distilled[k], ce_only[k]))
                drop[comparison].append((largest_drop(distilled[::-1]), largest_drop(ce_only[::-1])))
                values[middle_name(comparison, variant)] = difference([distilled[k]], [ce_only[k]], edge=flagged)
                values[drop_name(comparison, variant)] = difference(
                    [drop[comparison][-1][0]], [drop[comparison][-1][1]], -1, flagged
                )
            steps = selection["converged"][variant]["steps"]
            values[f"converged/{variant}: cross-entropy steps"] = EndpointValue(float(steps), float(steps), s.steps)
        for comparison in COMPARISONS:
            flagged = comparison == "converged" and edge
            values[middle_name(comparison)] = difference(*zip(*middle[comparison]), edge=flagged)
            values[drop_name(comparison)] = difference(*zip(*drop[comparison]), sign=-1, edge=flagged)
        student, teacher = record["parameters"]["student"], record["parameters"]["teacher"]
        spent = [selection["converged"][v]["steps"] * step_flops(student, teacher, False) for v in s.variants]
        distilled_flops = s.steps * step_flops(student, teacher, True)
        values["converged: training FLOPs, ce-only / distilled"] = EndpointValue(
            float(np.mean(spent)) / distilled_flops, float(np.mean(spent)), float(distilled_flops), edge
        )
        return values

    def plan_fields(self) -> dict[str, Any]:
        s = self.settings
        arms = "; ".join(f"{arm}: {loss}, {field or 'the ladder'}" for arm, (loss, field) in ARMS.items())
        return {
            "schema": CLAIMS_SCHEMA,
            "notes": [
                "Version 5 of the ADAPT question (issue 48): version 4 (adapt-frontier) compared distilled and "
                "cross-entropy-only students at 50 equal steps, where a distillation step costs about twice a "
                "cross-entropy step and plain cross-entropy had barely learned; its results were seen before this "
                "plan. This version's families, teachers, student, rows, schedule and distillation budget are "
                f"version 4's (families {', '.join(map(str, s.families))}, {s.runs} distillation seeds each, the "
                "same seeds, so its 12-layer family builds are reused from the lab's cache).",
                f"Arms per variant (student, budget): {arms}. Every cross-entropy student is `kinfolk distil`'s "
                "recipe with kl_weight 0 and cosine_weight 0, every other field of its config the distilled "
                "student's except max_steps (and the warm-up, min(50, steps // 10), that follows it). A longer budget "
                "reads more rows (batch x steps, one pass, from the same pre-training and post-training streams), "
                "as a user given that compute would.",
                "Equal training FLOPs: per token a training step costs about 2N for the forward and 4N for the "
                "backward of the N parameters that multiply (attention and MLP weights, the output head); a "
                "cross-entropy step costs 6 N_student, a distillation step 6 N_student + 2 N_teacher (the teacher's "
                "forward gives the KL targets and the block cosine's hidden states). The lab's 12-layer teacher has "
                "N = 3,158,400 and the 4-layer student 1,061,248 (vocabulary 99, width 128, MLP 512): ratio 1.992, "
                f"so {s.steps} distillation steps cost what {s.equal_flops_steps} cross-entropy steps cost "
                "(attention's sequence-length terms left out: rows of at most 64 tokens). Wall time is not the "
                "measure: the machine is shared.",
                "Converged: the cross-entropy student is trained at each budget of the ladder in turn (each from "
                "the init, its own schedule), its unpatched student scored on the validation problems, until a "
                f"budget fails to beat the best so far by more than {s.stop_tolerance}; the best so far is the "
                "converged student. A ladder that runs out is a grid edge (flagged). The converged student may "
                "use more compute than the distilled one: the exploratory 'converged: training FLOPs' says how "
                "much.",
                "Depth is not asked: in every size the depth, the number of teacher blocks and the parameter count "
                "rise together, so a concordance with depth cannot separate them (version 4's was 0.80; the null "
                "of 0.5 is not a question anyone asked). No routing and no transfer or format arm.",
                "What version 4's pilot (family 1, seed 999, large_instruct) saw of these budgets: the "
                "cross-entropy student's validation accuracy 0.015 at 50 steps, 0.113 at 75, 0.873 at 100, 0.807 at "
                "150; the distilled student's 0.780 at 50 steps. So the equal-FLOPs student (100 steps) may be the "
                "more accurate one at k = 0, and the ladder may stop at 100 or 150.",
                "Cost, estimated from version 4's timings (a 50-step distillation about 20 s, 150 steps 38 s, one "
                "curve of 2 orders x 5 sizes 25-30 s, one process at nice 19 on a shared machine): per variant the "
                "distilled student, the ladder's students (3 to 7 trainings of 50 to 600 steps, about 20 s to 2.5 "
                "min each, with one validation scoring each) and 4 curves; about 10-20 minutes a run, 10 runs in "
                "about 1.5-3.5 hours on two one-thread processes (`kinfolk lab experiment adapt-compute run` in two "
                "shells, then `analyse`). Not run yet: the lead starts it.",
            ],
        }
