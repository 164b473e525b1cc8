"""The real-boomerang experiment under `docs/protocol.md`: units are seeds, one run each.

Per seed, a two-phase distilled student of the teacher and, shared by every seed, the same student undistilled
(layer dropping alone); every size k = 0..M of each, patched in both orders, measured on held-out rows of three
sources (`runs`). A size's value is its log perplexity (or KL to the teacher) averaged over the sources with equal
weight; a curve's statistic is averaged over the two patch orders. Nothing is chosen after the runs: the budget,
the layer selection, the orders and the middle size are fixed in the plan, so the selection stage returns nothing.

Primaries (the trivial explanation each tests):
- the distilled arm's concordance of log perplexity with depth, and of KL to the teacher with depth (null 0.5,
  sizes of equal depth and the teacher itself left out): do deeper sizes sit closer to the teacher at all?
- undistilled minus distilled log perplexity at the middle size (k = M // 2): is interpolation just "more teacher
  blocks", which layer dropping alone would give as well?
- undistilled minus distilled largest step between consecutive sizes: does distillation remove the cliffs?

>>> experiment = RealBoomerang()
>>> [e.name for e in experiment.primaries()]  # doctest: +NORMALIZE_WHITESPACE
['distilled: log-ppl concordance with depth', 'distilled: KL concordance with depth',
 'middle size: log-ppl, undistilled - distilled', 'largest step: log-ppl, undistilled - distilled']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kinfolk.lab.experiments.real_boomerang.settings import BoomerangSettings
from kinfolk.lab.methods.adapt.size_curves import concordance, middle, step, student
from kinfolk.lab.protocol.experiment import ExploratoryEndpoint
from kinfolk.lab.protocol.plan import PrimaryEndpoint
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.lab.protocol.shared_seeds import SeedRuns, SharedSeedExperiment
from kinfolk.lab.protocol.views import SelectionView

CONCORDANCE_NULL = 0.5


class RealBoomerang(SharedSeedExperiment):
    name = "real-boomerang"
    version = "1"
    settings_class = BoomerangSettings

    def primaries(self) -> list[PrimaryEndpoint]:
        return [
            PrimaryEndpoint("distilled: log-ppl concordance with depth",
                            "share of size pairs of different depth where the deeper one has the lower log perplexity "
                            "(mean over sources), teacher left out, mean of both orders", "no trend", "higher",
                            CONCORDANCE_NULL),
            PrimaryEndpoint("distilled: KL concordance with depth",
                            "the same for KL(teacher || size) per token", "no trend", "higher", CONCORDANCE_NULL),
            PrimaryEndpoint("middle size: log-ppl, undistilled - distilled",
                            "log perplexity at k = M // 2, undistilled minus distilled, mean of both orders",
                            "undistilled", "higher"),
            PrimaryEndpoint("largest step: log-ppl, undistilled - distilled",
                            "largest rise of log perplexity from a size to the next smaller one, undistilled minus "
                            "distilled, mean of both orders", "undistilled", "higher"),
        ]  # fmt: skip

    def exploratory(self) -> list[ExploratoryEndpoint]:
        return [
            ExploratoryEndpoint("undistilled: log-ppl concordance with depth", "as the primary, undistilled arm",
                                "no trend", null=CONCORDANCE_NULL),
            ExploratoryEndpoint("undistilled: KL concordance with depth", "as the primary, undistilled arm",
                                "no trend", null=CONCORDANCE_NULL),
            ExploratoryEndpoint("distilled: agreement concordance with depth",
                                "the same for top-1 agreement with the teacher's tokens (higher is closer)",
                                "no trend", null=CONCORDANCE_NULL),
            ExploratoryEndpoint("student (k = 0): log-ppl, undistilled - distilled",
                                "log perplexity of the unpatched student", "undistilled"),
            ExploratoryEndpoint("middle size: KL, undistilled - distilled", "KL to the teacher at k = M // 2",
                                "undistilled"),
        ]  # fmt: skip

    def units(self) -> list[int]:
        return list(self.settings.seeds)

    def selection_rules(self) -> dict[str, str]:
        return {
            "none": "nothing is chosen after the runs: budget, layers, both patch orders (averaged) and the middle "
            "size k = M // 2 are fixed here"
        }

    def runs_class(self) -> type[SeedRuns]:
        from kinfolk.lab.experiments.real_boomerang.runs import RealBoomerangRuns

        return RealBoomerangRuns

    def select(self, view: SelectionView) -> dict[str, Any]:
        return {}

    def analyse(self, record: Mapping[str, Any], selection: dict[str, Any]) -> dict[str, EndpointValue]:
        distilled, undistilled = record["test"]["distilled"], record["test"]["undistilled"]

        def difference(statistic, measure: str) -> EndpointValue:
            ours, theirs = statistic(distilled, measure), statistic(undistilled, measure)
            return EndpointValue(theirs - ours, method=ours, baseline=theirs)

        return {
            "distilled: log-ppl concordance with depth": EndpointValue(concordance(distilled, "nll")),
            "distilled: KL concordance with depth": EndpointValue(concordance(distilled, "kl")),
            "middle size: log-ppl, undistilled - distilled": difference(middle, "nll"),
            "largest step: log-ppl, undistilled - distilled": difference(step, "nll"),
            "undistilled: log-ppl concordance with depth": EndpointValue(concordance(undistilled, "nll")),
            "undistilled: KL concordance with depth": EndpointValue(concordance(undistilled, "kl")),
            "distilled: agreement concordance with depth": EndpointValue(concordance(distilled, "agreement")),
            "student (k = 0): log-ppl, undistilled - distilled": difference(student, "nll"),
            "middle size: KL, undistilled - distilled": difference(middle, "kl"),
        }

    def provenance(self) -> dict[str, Any]:
        return {"records": self.settings.records}

    def runs_figure(self) -> Callable[[list[Mapping[str, Any]], str | Path], Path]:
        from kinfolk.lab.experiments.real_boomerang.figure import plot_curves

        return plot_curves
