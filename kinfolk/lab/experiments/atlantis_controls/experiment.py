"""atlantis-controls: does ATLANTIS's weighting gain survive the arms that could explain it away?

Version 2 found SFT weighted by `ratio` (a − b) ahead of uniform SFT on the reference model's own samples (`pr`).
The trivial explanation: the large base is trained *and* supplies a = log p_bL(y|x), and it already answers
0.955-0.99 of reversals in content, so a − b may win only because a is a verifier of its own answers. The arms
(`kinfolk.lab.experiments.atlantis_controls.settings`) that test it, each trained on the same pool for the same steps:

- the large base alone: `a-only` (a per byte, the formulas' transforms, temperature on validation) and the
  verifier `filter` (uniform SFT on the rows a ranks in its top fraction, the fraction on validation); the better
  of the two on validation is the pool's *large-base-only* arm;
- `uniform` with its learning rate chosen on validation, as each formula gets its temperature;
- a *weak* large base (the same pre-training run stopped once it answers 60 % of validation reversals), scoring a
  and trained in its turn: does the gain survive a large base that is not an answer key?
- `pd-off_format` (40 % ideal, 60 % off-format answers): `algorithm1` against `ratio`, the README's advice.

Primaries (paired per family, test accuracy on copy + reverse in the preferred format, every choice on
validation): ratio − large-base-only on `pr` and `pd-both`; ratio − tuned uniform on `pr`, under the strong and the
weak base; ratio − large-base-only under the weak base; algorithm1 − ratio on `pd-off_format`.

>>> [e.name for e in AtlantisControls().primaries()][:2]
['strong/pr: ratio - large-base-only', 'strong/pd-both: ratio - large-base-only']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kinfolk.lab.experiments.atlantis_controls.runs import AtlantisControlsRuns, grid_key
from kinfolk.lab.experiments.atlantis_controls.settings import ControlsSettings
from kinfolk.lab.protocol.experiment import ExploratoryEndpoint
from kinfolk.lab.protocol.family_runs import FamilyRunsExperiment
from kinfolk.lab.protocol.plan import PrimaryEndpoint
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.lab.protocol.views import SelectionView
from kinfolk.lab.world.skills import TARGET
from kinfolk.stats import on_grid_edge

LARGE_BASE_ONLY = "large-base-only"  # the better of a-only and filter on validation
WEIGHTED_CELLS = ("strong/pr", "strong/pd-both", "weak/pr")
OFF_FORMAT = "strong/pd-off_format"
ACCURACY = "test accuracy (copy + reverse, preferred format)"

# (cell, method, baseline): the declared comparisons, in the plan's order
PRIMARY = (
    ("strong/pr", "ratio", LARGE_BASE_ONLY),
    ("strong/pd-both", "ratio", LARGE_BASE_ONLY),
    ("strong/pr", "ratio", "uniform"),
    ("weak/pr", "ratio", "uniform"),
    ("weak/pr", "ratio", LARGE_BASE_ONLY),
    (OFF_FORMAT, "algorithm1", "ratio"),
)
EXPLORATORY = (
    ("strong/pd-both", "ratio", "uniform"),
    *((cell, arm, "uniform") for cell in WEIGHTED_CELLS for arm in ("a-only", "filter", "oracle")),
    *((cell, "ratio", arm) for cell in WEIGHTED_CELLS for arm in ("a-only", "filter")),
    (OFF_FORMAT, "ratio", "uniform"),
    (OFF_FORMAT, "algorithm1", "uniform"),
)
ARM_WORDS = {
    "ratio": "SFT weighted by a - b (temperature chosen on validation)",
    "algorithm1": "SFT weighted by a - b + c (temperature chosen on validation)",
    "uniform": "uniform SFT (learning rate chosen on validation)",
    LARGE_BASE_ONLY: "the large-base-only arm (a-only weights or the top-fraction filter, whichever with its "
    "setting scores best on validation)",
    "a-only": "SFT weighted by a alone (temperature chosen on validation)",
    "filter": "uniform SFT on the rows a ranks in its top fraction (fraction chosen on validation)",
    "oracle": "SFT weighted by the estimand p*/q",
}


def comparison_name(cell: str, method: str, baseline: str) -> str:
    return f"{cell}: {method} - {baseline}"


def _describe(cell: str, method: str, baseline: str) -> str:
    return (
        f"pool {cell} ({cell.split('/')[0]} large base): {ACCURACY} of {ARM_WORDS[method]} minus {ARM_WORDS[baseline]}"
    )


class AtlantisControls(FamilyRunsExperiment):
    name = "atlantis-controls"
    version = "3"
    settings_class = ControlsSettings
    family_runs_class = AtlantisControlsRuns

    def primaries(self) -> list[PrimaryEndpoint]:
        return [
            PrimaryEndpoint(comparison_name(*c), _describe(*c), baseline=c[2], direction="higher") for c in PRIMARY
        ]

    def _exploratory_comparisons(self) -> list[tuple[str, str, str]]:
        """EXPLORATORY, less the comparisons of arms these settings do not train."""
        arms = {cell.name: cell.arms for cell in self.settings.cells()}
        return [c for c in EXPLORATORY if c[1] in arms[c[0]] and c[2] in arms[c[0]]]

    def exploratory(self) -> list[ExploratoryEndpoint]:
        endpoints = [
            ExploratoryEndpoint(comparison_name(*c), _describe(*c), baseline=c[2])
            for c in self._exploratory_comparisons()
        ]
        endpoints.append(
            ExploratoryEndpoint(
                "weak base: reverse answer accuracy",
                "the weak large base's share of test reversals answered in content (any format), with the strong "
                "base's beside it: how far from an answer key a is",
                baseline="strong",
            )
        )
        endpoints += [
            ExploratoryEndpoint(
                f"{cell}: filter precision",
                "share of ideal responses among the rows the filter keeps at its validation-chosen fraction",
            )
            for cell in WEIGHTED_CELLS
        ]
        return endpoints

    def selection_rules(self) -> dict[str, str]:
        return {
            "grid values": "per cell and arm, the grid value (uniform: learning rate; formulas and a-only: "
            "temperature; filter: kept fraction) whose trained model has the highest validation accuracy (mean of "
            "copy and reverse); ties go to the first value of the ascending grid",
            LARGE_BASE_ONLY: "per cell, a-only or filter at its chosen value, whichever has the higher validation "
            "accuracy; ties go to a-only",
        }

    def select(self, view: SelectionView) -> dict[str, Any]:
        chosen: dict[str, Any] = {}
        for cell, entry in view["cells"].items():
            picks = {}
            for arm, grid in entry["arms"].items():
                values = self.settings.grid(arm)
                picks[arm] = max(values, key=lambda v: (grid[grid_key(v)]["validation"]["mean"], -values.index(v)))
            if "a-only" in picks and "filter" in picks:
                a_only, kept = (
                    entry["arms"][a][grid_key(picks[a])]["validation"]["mean"] for a in ("a-only", "filter")
                )
                picks[LARGE_BASE_ONLY] = "a-only" if a_only >= kept else "filter"
            chosen[cell] = picks
        return chosen

    def _test(self, record: Mapping[str, Any], picks: dict[str, Any], cell: str, arm: str) -> tuple[float, bool]:
        """The test accuracy of an arm at its chosen value, and whether that value lies on its grid's edge."""
        if arm == LARGE_BASE_ONLY:
            arm = picks[LARGE_BASE_ONLY]
        value = picks[arm]
        accuracy = record["cells"][cell]["arms"][arm][grid_key(value)]["test"]["mean"]
        return accuracy, on_grid_edge(value, self.settings.grid(arm))

    def analyse(self, record: Mapping[str, Any], selection: dict[str, Any]) -> dict[str, EndpointValue]:
        values: dict[str, EndpointValue] = {}
        for cell, method, baseline in (*PRIMARY, *self._exploratory_comparisons()):
            ours, our_edge = self._test(record, selection[cell], cell, method)
            theirs, their_edge = self._test(record, selection[cell], cell, baseline)
            values[comparison_name(cell, method, baseline)] = EndpointValue(
                ours - theirs, method=ours, baseline=theirs, grid_edge=our_edge or their_edge
            )
        weak, strong = (record["bases"][base]["scores"][TARGET]["answer_accuracy"] for base in ("weak", "strong"))
        values["weak base: reverse answer accuracy"] = EndpointValue(weak, method=weak, baseline=strong)
        for cell in WEIGHTED_CELLS:
            fraction = selection[cell]["filter"]
            precision = record["cells"][cell]["filter_precision"][grid_key(fraction)]
            values[f"{cell}: filter precision"] = EndpointValue(precision)
        return values

    def plan_fields(self) -> dict[str, Any]:
        return {
            "notes": [
                "Version 3 of the ATLANTIS question: new runs on LAB_VERSION 4 (fp32) families 0-4, two runs (pool "
                "draw and training seed) per family; version 2 (the re-analysis) stays as it was.",
                "Written after version 2's results were seen; its arms were asked for by a review of those results "
                "(issue 25), so which comparisons are primary was chosen knowing them.",
                "The temperature grid gained 0.25 because version 2 chose its lower edge, 0.5, in 16 of its 30 choices.",
                "The weak large base is the strong base's own pre-training run, stopped at the first 25-step check "
                "where it answers at least 60 % of validation reversals; how far below the strong base it lands is "
                "reported per family (exploratory).",
            ]
        }
