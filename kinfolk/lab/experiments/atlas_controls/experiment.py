"""atlas-controls: is ATLAS's lower drift more than format spill-over onto the atlas's own template?

Version 1 measured drift only on the atlas's template (copy answers in the preferred format) while the targets are
mostly format switches, at absolute KLs near the float floor, with grids whose edges selection kept choosing. This
version (settings: `settings`; rows: `sources`) measures drift on three sources that are not the atlas's (copy in
the other formats, additions, pre-training text), adds PEFT's OSF and the distance- and PCA-scaled residuals,
extends the grids, runs two adapter seeds per family, and makes every choice on validation:

- levels: fractions (`gain_levels`) of LoRA's best validation gain over the frozen validation score;
- per level and method: among all its runs' trained checkpoints whose validation gain reaches the level, the one
  with the lowest validation drift (the geometric mean of KL over the three other sources); none when none reaches.

Test numbers of those checkpoints are reported; a comparison is ln(drift_ATLAS / drift_other), negative favouring
ATLAS, and is left undefined where either drift is within 10x of the floor (the larger of the two methods' step-0
drifts in that run: their untrained adapters, measured under the same code and rows).

Primaries, per target at the high level: ATLAS vs LoRA; vs the norm-matched control (is it only a smaller step?);
vs LoRA + Output-KL (does the standard regulariser do as well?).

>>> [e.name for e in AtlasControls().primaries()][:2]
['reverse/high: atlas vs lora, log drift ratio', 'reverse/high: atlas vs norm-matched, log drift ratio']
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kinfolk.lab.experiments.atlas_controls.runs import AtlasControlsRuns
from kinfolk.lab.experiments.atlas_controls.settings import OTHER_SOURCES, SOURCES, ControlsSettings
from kinfolk.lab.methods.atlas.runs import run_name
from kinfolk.lab.methods.selection import best_score, drift, levels, lowest_drift
from kinfolk.lab.protocol.experiment import ExploratoryEndpoint
from kinfolk.lab.protocol.family_runs import FamilyRunsExperiment
from kinfolk.lab.protocol.plan import PrimaryEndpoint
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.lab.protocol.views import SelectionView
from kinfolk.stats import on_grid_edge

METHOD, BASELINE = "atlas", "lora"
PRIMARY_LEVEL = "high"
PRIMARY_OTHERS = ("lora", "norm-matched", "lora+output-kl")
FLOOR_FACTOR = 10.0  # no ratio where either value is within this factor of the floor


def _points(runs: Mapping[str, Any], method: str, settings: ControlsSettings, split: str) -> list[dict[str, Any]]:
    """Every checkpoint of every run of `method`, flat: {"run", "step", "target", "kl"} on one split."""
    return [
        {"run": run_name(method, rate, strength), "step": p["step"], **p[split]}
        for rate, strength in settings.runs_of(method)
        for p in runs[run_name(method, rate, strength)]["points"]
    ]


class AtlasControls(FamilyRunsExperiment):
    name = "atlas-controls"
    version = "3"
    settings_class = ControlsSettings
    family_runs_class = AtlasControlsRuns

    def _others(self) -> list[str]:
        return [m for m in self.settings.methods if m != METHOD]

    def primaries(self) -> list[PrimaryEndpoint]:
        return [
            PrimaryEndpoint(
                f"{target}/{PRIMARY_LEVEL}: atlas vs {other}, log drift ratio",
                f"target {target}: ln(drift_atlas / drift_{other}) on test, each at its checkpoint chosen on "
                f"validation at {self.settings.gain_levels[PRIMARY_LEVEL]:g} of LoRA's best validation gain; drift "
                f"is the geometric mean over {', '.join(OTHER_SOURCES)} (none of them the atlas's fitting data) of "
                "KL(frozen || current) per token",
                other,
                "lower",
            )
            for target in self.settings.targets
            for other in PRIMARY_OTHERS
        ]

    def exploratory(self) -> list[ExploratoryEndpoint]:
        endpoints = []
        for target in self.settings.targets:
            for level in self.settings.gain_levels:
                for other in self._others():
                    if level == PRIMARY_LEVEL and other in PRIMARY_OTHERS:
                        continue
                    endpoints.append(ExploratoryEndpoint(
                        f"{target}/{level}: atlas vs {other}, log drift ratio", "as the primaries", other, "lower"))  # fmt: skip
            for other in self._others():
                for source in SOURCES:
                    endpoints.append(ExploratoryEndpoint(
                        f"{target}/{PRIMARY_LEVEL}: atlas vs {other}, log KL ratio on {source}",
                        f"ln(KL_atlas / KL_{other}) on the {source} rows alone (test)"
                        + (": the atlas's own template, version 1's measure" if source == "copy" else ""),
                        other, "lower"))  # fmt: skip
                endpoints.append(ExploratoryEndpoint(
                    f"{target}/{PRIMARY_LEVEL}: atlas - {other}, test gain",
                    "the test target gain of the two chosen checkpoints: how well the validation match holds", other))  # fmt: skip
            for method in self.settings.methods:
                if method != BASELINE:
                    endpoints.append(ExploratoryEndpoint(
                        f"{target}: reach of {method}", "the method's best validation gain as a fraction of LoRA's",
                        BASELINE, null=1.0))  # fmt: skip
            for source in SOURCES:
                endpoints.append(ExploratoryEndpoint(
                    f"{target}: floor on {source}", "the largest step-0 (untrained adapter) KL of any method's run "
                    "on this source (test)"))  # fmt: skip
        return endpoints

    def selection_rules(self) -> dict[str, str]:
        return {
            "levels": "validation: per target, fractions (gain_levels) of LoRA's best validation gain (any of its "
            "runs, any trained checkpoint) over the frozen validation score (the step-0 score)",
            "checkpoints": "validation: per target, level and method, among every run's trained checkpoints whose "
            "validation gain reaches the level, the one with the lowest validation drift (geometric mean of KL on "
            "copy-formats, add and text); ties to the earlier run of the grid, then the earlier step; none when no "
            "checkpoint reaches the level",
        }

    def select(self, view: SelectionView) -> dict[str, Any]:
        chosen: dict[str, Any] = {}
        for target in self.settings.targets:
            runs = view["targets"][target]
            points = {m: _points(runs, m, self.settings, "validation") for m in self.settings.methods}
            frozen = next(p["target"] for p in points[BASELINE] if p["step"] == 0)
            gain = best_score(points[BASELINE], "target") - frozen
            at = levels(self.settings.gain_levels, points[BASELINE], "target", frozen) if gain > 0 else {}
            picks: dict[str, Any] = {}
            for level, value in at.items():
                picks[level] = {}
                for method, ours in points.items():  # each method's runs in grid order, checkpoints by step
                    pick = lowest_drift(ours, value, "target", OTHER_SOURCES)
                    picks[level][method] = None if pick is None else {"run": pick["run"], "step": pick["step"]}
            reach = {m: (best_score(ps, "target") - frozen) / gain if gain > 0 else None for m, ps in points.items()}
            chosen[target] = {"frozen": frozen, "levels": at, "checkpoints": picks, "reach": reach}
        return chosen

    def _edge(self, method: str, run: str) -> bool:
        grid = self.settings.grid_of(method)
        rate, strength = next((r, s) for r, s in self.settings.runs_of(method) if run_name(method, r, s) == run)
        return on_grid_edge(rate if strength is None else strength, grid)

    def analyse(self, record: Mapping[str, Any], selection: dict[str, Any]) -> dict[str, EndpointValue]:
        values: dict[str, EndpointValue] = {}
        for target in self.settings.targets:
            chosen = _Chosen(self, record["targets"][target], selection[target])
            for level in self.settings.gain_levels:
                for other in self._others():
                    name = f"{target}/{level}: atlas vs {other}, log drift ratio"
                    values[name] = chosen.ratio(other, level, OTHER_SOURCES)
            for other in self._others():
                for source in SOURCES:
                    name = f"{target}/{PRIMARY_LEVEL}: atlas vs {other}, log KL ratio on {source}"
                    values[name] = chosen.ratio(other, PRIMARY_LEVEL, (source,))
                values[f"{target}/{PRIMARY_LEVEL}: atlas - {other}, test gain"] = chosen.gain_difference(other)
            for method in self.settings.methods:
                if method != BASELINE:
                    values[f"{target}: reach of {method}"] = EndpointValue(selection[target]["reach"][method])
            for source in SOURCES:
                values[f"{target}: floor on {source}"] = EndpointValue(chosen.floor(self.settings.methods, (source,)))
        return values

    def plan_fields(self) -> dict[str, Any]:
        return {
            "notes": [
                "Version 3 of the ATLAS question: new runs on LAB_VERSION 4 (fp32) ATLAS families 0-4 (8-layer large "
                "base that pre-trains on reverse and flip in every format), two adapter seeds per family; version 2 "
                "(the re-analysis of version 1's runs) stays as it was. Written after version 2's results were seen, "
                "on a review's request (issue 25).",
                "No content-gain target: on the default family (where flip is never pre-trained) LoRA at this "
                "placement learned neither flip (0 of 50 validation problems at rates 1e-2, 3e-2, 1e-1, ranks 4 and "
                "16, up to 400 steps) nor add (at most 6 %), so both targets remain format switches of skills the "
                "frozen model has, as in version 1; the drift sources that are not the atlas's answer the spill-over "
                "question instead.",
                "Timing before this plan: four runs of family 0, adapter seed 0, target reverse (LoRA 1e-3, ATLAS "
                "1e-2, OSF 3e-2, Output-KL 10) took 20-30 s each beside three other jobs; their validation curves "
                "were seen (ATLAS drifted more than LoRA on add and text there). They were made in a scratch folder "
                "and are not among the plan's runs, which rerun them. The primaries were not changed after seeing "
                "them: they are real-atlas's three comparisons, per target.",
            ]
        }


class _Chosen:
    """One target's runs and the checkpoints its selection chose: their test numbers, floors and comparisons."""

    def __init__(self, experiment: AtlasControls, runs: Mapping[str, Any], selection: Mapping[str, Any]):
        self.experiment, self.settings, self.runs, self.selection = experiment, experiment.settings, runs, selection

    def test_point(self, method: str, level: str) -> dict[str, Any] | None:
        pick = self.selection["checkpoints"].get(level, {}).get(method)
        if pick is None:
            return None
        return next(p["test"] for p in self.runs[pick["run"]]["points"] if p["step"] == pick["step"])

    def step_zero(self, method: str) -> list[dict[str, Any]]:
        """The test numbers of each of the method's runs at step 0 (its untrained adapter)."""
        names = [run_name(method, rate, strength) for rate, strength in self.settings.runs_of(method)]
        return [p["test"] for name in names for p in self.runs[name]["points"] if p["step"] == 0]

    def floor(self, methods, sources) -> float:
        return max(drift(point, sources) for method in methods for point in self.step_zero(method))

    def ratio(self, other: str, level: str, sources) -> EndpointValue:
        ours, theirs = self.test_point(METHOD, level), self.test_point(other, level)
        if ours is None or theirs is None:
            return EndpointValue(None)
        picks = self.selection["checkpoints"][level]
        edge = self.experiment._edge(METHOD, picks[METHOD]["run"]) or self.experiment._edge(other, picks[other]["run"])
        a, b = drift(ours, sources), drift(theirs, sources)
        if min(a, b) < FLOOR_FACTOR * self.floor((METHOD, other), sources):
            return EndpointValue(None, method=a, baseline=b, grid_edge=edge)
        return EndpointValue(math.log(a) - math.log(b), method=a, baseline=b, grid_edge=edge)

    def gain_difference(self, other: str) -> EndpointValue:
        frozen = self.step_zero(BASELINE)[0]["target"]
        ours, theirs = self.test_point(METHOD, PRIMARY_LEVEL), self.test_point(other, PRIMARY_LEVEL)
        if ours is None or theirs is None:
            return EndpointValue(None)
        a, b = ours["target"] - frozen, theirs["target"] - frozen
        return EndpointValue(a - b, method=a, baseline=b)
