"""Real-boomerang version 2 under `docs/protocol.md`: units are seeds, one run each.

Version 1 found the distilled student's sizes ordered by depth, but so were the untrained student's, its units shared
one set of 18 measured rows, and no arm was trained without distillation. Per seed, this version measures every
size k = 0..M (both patch orders) of three students on the seed's own draw of 32 held-out rows per source: the
student distilled with ADAPT's loss, the same student trained with cross-entropy alone (`ce-only`: the same rows,
order, steps and schedule) and the untrained layer-dropped student. A size's value is its log perplexity (or KL to
the teacher) averaged over the sources; a curve's statistic is averaged over the two patch orders. Nothing is chosen
after the runs.

Primaries (the trivial explanation each tests):
- ce-only minus distilled log perplexity, and KL to the teacher, at the middle size k = M // 2: is what distillation
  gives the sizes just what training the student on the same rows gives?
- ce-only minus distilled largest step between consecutive sizes: are the cliffs training's or distillation's?
- undistilled minus distilled log perplexity at the middle size, and largest step: version 1's comparisons, on
  independent rows per seed.

>>> [e.name for e in RealBoomerangControls().primaries()]  # doctest: +NORMALIZE_WHITESPACE
['middle size: log-ppl, ce-only - distilled', 'middle size: KL, ce-only - distilled',
 'largest step: log-ppl, ce-only - distilled', 'middle size: log-ppl, undistilled - distilled',
 'largest step: log-ppl, undistilled - distilled']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kinfolk.lab.experiments.real_boomerang_controls.settings import RealBoomerangControlsSettings
from kinfolk.lab.methods.adapt.size_curves import ORDERS, concordance, middle, size_value, step, student
from kinfolk.lab.protocol.experiment import ExploratoryEndpoint
from kinfolk.lab.protocol.plan import PrimaryEndpoint
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.lab.protocol.shared_seeds import SeedRuns, SharedSeedExperiment
from kinfolk.lab.protocol.views import SelectionView

CONCORDANCE_NULL = 0.5
METHOD = "distilled"
OTHERS = ("ce-only", "undistilled")
MEASURE_NAMES = {"nll": "log-ppl", "kl": "KL"}
STATISTICS = {"middle size": middle, "largest step": step, "student (k = 0)": student}
PRIMARIES = (("middle size", "nll", "ce-only"), ("middle size", "kl", "ce-only"), ("largest step", "nll", "ce-only"),
             ("middle size", "nll", "undistilled"), ("largest step", "nll", "undistilled"))  # fmt: skip
DESCRIPTIONS = {
    "middle size": "at k = M // 2, mean of both orders",
    "largest step": "largest rise from a size to the next smaller one, mean of both orders",
    "student (k = 0)": "of the unpatched student",
}


def comparison(statistic: str, measure: str, other: str) -> str:
    return f"{statistic}: {MEASURE_NAMES[measure]}, {other} - {METHOD}"


def size_comparison(order: str, k: int, other: str) -> str:
    return f"{order} k = {k}: log-ppl, {other} - {METHOD}"


class RealBoomerangControls(SharedSeedExperiment):
    name = "real-boomerang-controls"
    version = "2"
    settings_class = RealBoomerangControlsSettings

    def primaries(self) -> list[PrimaryEndpoint]:
        return [
            PrimaryEndpoint(comparison(statistic, measure, other),
                            f"{'log perplexity' if measure == 'nll' else 'KL(teacher || size) per token'} "
                            f"{DESCRIPTIONS[statistic]}, {other} minus distilled (positive: the distilled sizes are "
                            "closer to the teacher)", other, "higher")
            for statistic, measure, other in PRIMARIES
        ]  # fmt: skip

    def exploratory(self) -> list[ExploratoryEndpoint]:
        endpoints = []
        for statistic in STATISTICS:
            for measure in MEASURE_NAMES:
                for other in OTHERS:
                    if (statistic, measure, other) not in PRIMARIES:
                        endpoints.append(
                            ExploratoryEndpoint(
                                comparison(statistic, measure, other),
                                f"as the primaries: {DESCRIPTIONS[statistic]}",
                                other,
                            )
                        )
        for arm in self.settings.arms:
            for measure in MEASURE_NAMES:
                endpoints.append(ExploratoryEndpoint(
                    f"{arm}: {MEASURE_NAMES[measure]} concordance with depth",
                    "share of size pairs of different depth where the deeper one is closer to the teacher, teacher "
                    "left out, mean of both orders", "no trend", null=CONCORDANCE_NULL))  # fmt: skip
        for order in ORDERS:
            for k in range(self.settings.patched_blocks):  # k = M is the teacher itself in every arm
                for other in OTHERS:
                    endpoints.append(ExploratoryEndpoint(size_comparison(order, k, other),
                                                         "log perplexity of this size", other))  # fmt: skip
        return endpoints

    def units(self) -> list[int]:
        return list(self.settings.seeds)

    def selection_rules(self) -> dict[str, str]:
        return {
            "none": "nothing is chosen after the runs: budget, layers, arms, both patch orders (averaged) and the "
            "middle size k = M // 2 are fixed here"
        }

    def runs_class(self) -> type[SeedRuns]:
        from kinfolk.lab.experiments.real_boomerang_controls.runs import RealBoomerangControlsRuns

        return RealBoomerangControlsRuns

    def select(self, view: SelectionView) -> dict[str, Any]:
        return {}

    def analyse(self, record: Mapping[str, Any], selection: dict[str, Any]) -> dict[str, EndpointValue]:
        curves = record["test"]
        blocks = len(curves[METHOD][ORDERS[0]]) - 1
        if blocks != self.settings.patched_blocks:
            raise ValueError(f"seed {record['seed']}: {blocks} patched blocks, the plan has "
                             f"{self.settings.patched_blocks}")  # fmt: skip
        values: dict[str, EndpointValue] = {}
        for name, function in STATISTICS.items():
            for measure in MEASURE_NAMES:
                ours = function(curves[METHOD], measure)
                for other in OTHERS:
                    theirs = function(curves[other], measure)
                    values[comparison(name, measure, other)] = EndpointValue(theirs - ours, method=ours,
                                                                             baseline=theirs)  # fmt: skip
        for arm in self.settings.arms:
            for measure in MEASURE_NAMES:
                name = f"{arm}: {MEASURE_NAMES[measure]} concordance with depth"
                values[name] = EndpointValue(concordance(curves[arm], measure))
        for order in ORDERS:
            for k in range(self.settings.patched_blocks):
                ours = size_value(curves[METHOD][order][k], "nll")
                for other in OTHERS:
                    theirs = size_value(curves[other][order][k], "nll")
                    values[size_comparison(order, k, other)] = EndpointValue(theirs - ours, method=ours,
                                                                             baseline=theirs)  # fmt: skip
        return values

    def plan_fields(self) -> dict[str, Any]:
        return {
            "notes": [
                "Version 1's teacher, student ({every: 2, last: 1}: 16 of 30 layers, M = 16 blocks), training rows "
                "and budget (80 steps of 4 rows of at most 128 tokens, half on pre-training text) are kept; what "
                "changes is the measurement (32 rows per source drawn per seed from held-out pools of 184 documentation "
                "chunks, 882 code chunks and 81 chat instructions; 64 tokens per row) and the ce-only arm.",
                "The ce-only arm is `kinfolk distil`'s recipe with kl_weight 0 and cosine_weight 0: cross-entropy on "
                "the same rows, in the same order, with the same steps, schedule and learning rate.",
                "Measured rows are 64 tokens (version 1: 128) so that three arms of 34 sizes fit one core's hour per "
                "seed; on chat rows only the answer's tokens within them count.",
                "Documentation is cut into chunks of about 600 characters (version 1: whole topics, of which 20 were "
                "held out), split by topic, so no topic is both trained on and measured.",
            ]
        }

    def provenance(self) -> dict[str, Any]:
        return {"records": self.settings.records}

    def runs_figure(self) -> Callable[[list[Mapping[str, Any]], str | Path], Path]:
        from kinfolk.lab.experiments.real_boomerang_controls.figure import plot_curves

        return plot_curves
