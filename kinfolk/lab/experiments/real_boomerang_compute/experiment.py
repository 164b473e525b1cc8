"""Real-boomerang version 3 under `docs/protocol.md`: units are seeds, one run each.

Version 2 compared the distilled student with one trained on cross-entropy alone at 80 equal steps, while its
distilled arm took about 1.5 times the training time (a distillation step adds the teacher's forward). Per seed, this
version draws 64 measured and 16 validation rows per source (apart) and measures every size k = 0..M (both patch
orders) of the distilled student (80 steps) and of cross-entropy-only students at 80 steps (version 2's arm,
exploratory), at equal training FLOPs (122 steps) and at the budget of a ladder where their unpatched student's
validation log perplexity stopped improving. A size's value is its log perplexity (or KL to the teacher) averaged
over the sources; a curve's statistic is averaged over the two patch orders. The undistilled arm and the depth
question are left out: version 2 answered the first, and depth cannot be told from block or parameter count here.

>>> [e.name for e in RealBoomerangCompute().primaries()]  # doctest: +NORMALIZE_WHITESPACE
['equal FLOPs: middle size log-ppl, ce-only - distilled', 'equal FLOPs: largest step log-ppl, ce-only - distilled',
 'converged: middle size log-ppl, ce-only - distilled', 'converged: largest step log-ppl, ce-only - distilled']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kinfolk.lab.experiments.real_boomerang_compute.settings import RealBoomerangComputeSettings
from kinfolk.lab.methods.adapt.size_curves import middle, step
from kinfolk.lab.methods.compute import converged_budget, step_flops
from kinfolk.lab.protocol.experiment import ExploratoryEndpoint
from kinfolk.lab.protocol.plan import CLAIMS_SCHEMA, Claim, PrimaryEndpoint
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.lab.protocol.shared_seeds import SeedRuns, SharedSeedExperiment
from kinfolk.lab.protocol.views import SelectionView

METHOD = "distilled"
COMPARISONS = {
    "equal FLOPs": "ce-only/equal-flops",
    "converged": "ce-only/converged",
    "equal steps": "ce-only/equal-steps",
}
PRIMARY_COMPARISONS = ("equal FLOPs", "converged")
STATISTICS = {"middle size": middle, "largest step": step}
MEASURES = {"nll": "log-ppl", "kl": "KL"}
NOT_SIGNIFICANT = "not significant after Holm's correction"


def endpoint_name(comparison: str, statistic: str, measure: str = "nll") -> str:
    return f"{comparison}: {statistic} {MEASURES[measure]}, ce-only - {METHOD}"


class RealBoomerangCompute(SharedSeedExperiment):
    name = "real-boomerang-compute"
    version = "3"
    settings_class = RealBoomerangComputeSettings

    def scope(self, comparison: str) -> str:
        """Where a comparison is measured; its claim's sentences say it word for word."""
        s = self.settings
        where = f"on SmolLM2-135M-Instruct and its {s.patched_blocks}-layer student ({len(s.seeds)} seeds)"
        if comparison == "equal FLOPs":
            return (f"{where} at equal training FLOPs ({s.steps} distilled steps against {s.equal_flops_steps} "
                    "cross-entropy steps, the teacher's forward counted)")  # fmt: skip
        return (f"{where} against a cross-entropy student trained until its validation log perplexity stopped "
                f"improving (up to {max(s.ce_budgets)} steps), the distilled student at {s.steps} steps")  # fmt: skip

    def claim(self, comparison: str, statistic: str) -> Claim:
        scope = self.scope(comparison)
        ce = "cross-entropy alone"  # the scope says at which budget
        what = {
            "middle size": ("were closer to the teacher in log perplexity at the middle size than sizes of a student "
                            f"trained on {ce}"),
            "largest step": f"had a smaller largest log-perplexity step between sizes than those of a student trained on {ce}",
        }[statistic]  # fmt: skip
        reversed_ = {
            "middle size": f"Sizes of a student trained on {ce} were closer to the teacher at the middle size than "
            "distilled sizes",
            "largest step": f"Sizes of a student trained on {ce} had a smaller largest step than distilled sizes",
        }[statistic]
        return Claim(
            scope,
            f"Distilled patched sizes {what}, {scope}.",
            f"Distilled against {ce}, the {statistic} in log perplexity: {NOT_SIGNIFICANT}, {scope}.",
            f"{reversed_}, {scope}.",
        )

    def primaries(self) -> list[PrimaryEndpoint]:
        s = self.settings
        budget = {
            "equal FLOPs": f"trained {s.equal_flops_steps} steps, the training FLOPs of the distilled student's "
            f"{s.steps} (6 N_student per token per cross-entropy step, 6 N_student + 2 N_teacher per distillation "
            "step)",
            "converged": "trained at the budget of its ladder where its unpatched student's validation log perplexity "
            f"stopped improving (by more than {s.stop_tolerance} nats; budgets {', '.join(map(str, s.ce_budgets))})",
        }
        where = {"middle size": "at k = M // 2, mean of both orders",
                 "largest step": "largest rise from a size to the next smaller one, mean of both orders"}  # fmt: skip
        return [
            PrimaryEndpoint(
                endpoint_name(comparison, statistic),
                f"log perplexity {where[statistic]}: the cross-entropy-only student ({budget[comparison]}) minus the "
                f"distilled student ({s.steps} steps); positive: the distilled sizes are closer to the teacher",
                "ce-only", "higher", claim=self.claim(comparison, statistic),
            )
            for comparison in PRIMARY_COMPARISONS
            for statistic in STATISTICS
        ]  # fmt: skip

    def exploratory(self) -> list[ExploratoryEndpoint]:
        endpoints = [
            ExploratoryEndpoint(endpoint_name(comparison, statistic, measure), "as the primaries", "ce-only")
            for comparison in COMPARISONS
            for statistic in STATISTICS
            for measure in MEASURES
            if not (comparison in PRIMARY_COMPARISONS and measure == "nll")
        ]
        endpoints += [
            ExploratoryEndpoint("converged: cross-entropy steps", "the ladder's converged budget", "distilled"),
            ExploratoryEndpoint("converged: training FLOPs, ce-only / distilled",
                                "the converged student's training FLOPs over the distilled student's", "distilled"),
            ExploratoryEndpoint("equal FLOPs: training seconds, ce-only / distilled",
                                "measured wall time of the two trainings (a shared machine: a reading, not a cost)",
                                "distilled"),
        ]  # fmt: skip
        return endpoints

    def units(self) -> list[int]:
        return list(self.settings.seeds)

    def selection_rules(self) -> dict[str, str]:
        s = self.settings
        return {
            "converged budget": f"climbing the budgets {', '.join(map(str, s.ce_budgets))}: the budget with the "
            "lowest validation log perplexity of the unpatched cross-entropy student before the first budget that "
            f"does not lower it by more than {s.stop_tolerance} nats; the last budget (flagged as a grid edge) if "
            "every one does; on the seed's validation rows, apart from its measured rows",
            "fixed": "budgets, layers, both patch orders (averaged) and the middle size k = M // 2 are fixed here",
        }

    def runs_class(self) -> type[SeedRuns]:
        from kinfolk.lab.experiments.real_boomerang_compute.runs import RealBoomerangComputeRuns

        return RealBoomerangComputeRuns

    def select(self, view: SelectionView) -> dict[str, Any]:
        rungs = [(rung["steps"], rung["nll"]) for rung in view["validation"]["ladder"]]
        steps, edge = converged_budget(rungs, self.settings.stop_tolerance, higher_is_better=False)
        return {"converged": {"steps": steps, "edge": edge}}

    def analyse(self, record: Mapping[str, Any], selection: dict[str, Any]) -> dict[str, EndpointValue]:
        s, curves = self.settings, record["test"]
        blocks = len(curves[METHOD]["front-to-back"]) - 1
        if blocks != s.patched_blocks:
            raise ValueError(f"seed {record['seed']}: {blocks} patched blocks, the plan has {s.patched_blocks}")
        edge = selection["converged"]["edge"]
        values: dict[str, EndpointValue] = {}
        for comparison, arm in COMPARISONS.items():
            for statistic, function in STATISTICS.items():
                for measure in MEASURES:
                    ours, theirs = function(curves[METHOD], measure), function(curves[arm], measure)
                    values[endpoint_name(comparison, statistic, measure)] = EndpointValue(
                        theirs - ours, ours, theirs, comparison == "converged" and edge
                    )
        steps = selection["converged"]["steps"]
        student, teacher = record["parameters"]["student"], record["parameters"]["teacher"]
        spent, distilled = steps * step_flops(student, teacher, False), s.steps * step_flops(student, teacher, True)
        values["converged: cross-entropy steps"] = EndpointValue(float(steps), float(steps), float(s.steps), edge)
        values["converged: training FLOPs, ce-only / distilled"] = EndpointValue(spent / distilled, spent, distilled)
        seconds = record["training_seconds"]
        values["equal FLOPs: training seconds, ce-only / distilled"] = EndpointValue(
            seconds["ce-only/equal-flops"] / seconds[METHOD], seconds["ce-only/equal-flops"], seconds[METHOD]
        )
        return values

    def plan_fields(self) -> dict[str, Any]:
        s = self.settings
        return {
            "schema": CLAIMS_SCHEMA,
            "notes": [
                "Version 3 of the real-checkpoint ADAPT question (issue 48), written after version 2's results were "
                "seen: version 2 compared distilled and cross-entropy-only students at 80 equal steps while its "
                "distilled arm took about 1.5 times the training time. Version 2's teacher, student ({every: 2, "
                "last: 1}: 16 of 30 layers), rows, schedule and distillation budget are kept; the undistilled arm "
                "(answered by version 2) and the depth question (depth, teacher-block count and parameter count "
                "rise together: not identifiable here) are left out.",
                "Equal training FLOPs (kinfolk.lab.methods.compute): per token a cross-entropy step costs 6 "
                "N_student, a distillation step 6 N_student + 2 N_teacher, N counting the weights that multiply "
                "(projections with 3 key-value heads of 9, the gated MLP, the tied output head). SmolLM2-135M-"
                "Instruct: N = 134,479,872; its 16-layer student: 84,934,656; ratio 1.528, so 80 distillation steps "
                f"cost what {s.equal_flops_steps} cross-entropy steps cost. A longer budget reads more rows (batch "
                "x steps, one pass of the pre-training draw; the chat SFT rows repeat where the prompts run out).",
                "Converged: the cross-entropy student is trained at each budget of the ladder in turn (each from "
                "the layer-dropped init, its own schedule) and its unpatched student measured on the seed's "
                f"{s.validation_rows_per_source} validation rows per source (drawn with the measured rows, apart "
                f"from them), until a budget fails to lower the best log perplexity so far by more than "
                f"{s.stop_tolerance} nats; the best so far is the converged student.",
                f"Measurement: {s.measured_rows_per_source} rows per source (the protocol's 64), drawn per seed from "
                "the held-out pools of version 2 (184 documentation chunks, 882 code chunks, 81 chat instructions), "
                f"{s.measured_length} tokens each. The seeds share the teacher, the student's initialisation and "
                "part of the training rows; the intervals do not cover those.",
                "Cost, estimated from version 2's timings (one process beside other jobs: a trained arm 7-19 "
                "minutes, 34 sizes on 96 rows 10.5-14 minutes): per seed 3-5 trainings of 80-320 steps (about "
                "7-40 minutes each), 3-4 curves of 34 sizes on 192 rows (about 20-28 minutes each) and the "
                "teacher's reference (about 2 GB of log-probabilities per seed held in memory): about 2-2.5 "
                "process-hours a seed, 10-12 for five, so 5-6 hours on two processes (`kinfolk lab experiment "
                "real-boomerang-compute run --seeds ...` in two shells, then `analyse`). Not run yet: the lead "
                "starts it.",
            ],
        }

    def provenance(self) -> dict[str, Any]:
        return {"records": self.settings.records}
