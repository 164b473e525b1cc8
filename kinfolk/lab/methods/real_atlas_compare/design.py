"""real-atlas version 2's design under `docs/protocol.md`, shared by its models: units are seeds, every run trained
and measured by `kinfolk compare`.

Per seed, LoRA (the baseline), ATLAS, its norm-matched control and LoRA + Output-KL learn Python code at ATLAS's
placement and rank, each arm a planned `kinfolk compare` of one method on the seed's draw of 64 validation and 64
test rows per source (`runs`). Output-KL's strength is chosen on the seed's validation split by compare's rule,
its grid extended one step while the choice sits on an edge. compare's analysis of the seed (`verdicts`) finds,
on validation, where each run first reaches a fraction of LoRA's gain, and reads its test drift there (the one
matching rule, interpolated along the curve); a comparison is ln(drift_ATLAS / drift_other), negative favours ATLAS.
Drift is the geometric mean over the retained sources (the model's own chat answers, Shakespeare's Sonnets, the
standard library's documentation) of KL(frozen || current) per token.

Primaries, at 50 % of LoRA's gain (the trivial explanation each tests): ATLAS against LoRA (does it move retained
answers less at all?), against its norm-matched control (is it only a smaller step?), against LoRA + Output-KL
(does the standard regulariser do as well?).

>>> class OnAModel(RealAtlasCompareDesign):
...     name, model_words = "toy", "a model"
>>> [e.name for e in OnAModel().primaries()]  # doctest: +NORMALIZE_WHITESPACE
['50%: atlas vs lora, log drift ratio', '50%: atlas vs norm_matched, log drift ratio',
 '50%: atlas vs lora_output_kl, log drift ratio']
>>> OnAModel().primaries()[0].claim.scope.split(",")[0]
'on a model learning Python code'
>>> "learning rates" in OnAModel().selection_rules()  # each model's experiment says how its rates were fixed
False
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from kinfolk.lab.methods.real_atlas_compare.settings import BASELINE, OUTPUT_KL, RealAtlasCompareSettings
from kinfolk.lab.protocol.experiment import ExploratoryEndpoint
from kinfolk.lab.protocol.plan import Claim, PrimaryEndpoint
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.lab.protocol.shared_seeds import SeedRuns, SharedSeedExperiment
from kinfolk.lab.protocol.views import SelectionView

METHOD = "atlas"
PRIMARY_FRACTION = 0.5
NOT_SIGNIFICANT = "not significant after Holm's correction"
WORDS = {"lora": "LoRA", "norm_matched": "ATLAS's norm-matched control", OUTPUT_KL: "LoRA + Output-KL"}


def percent(fraction: float) -> str:
    return f"{fraction:.0%}"


def ratio_name(fraction: float, method: str, other: str, source: str | None = None) -> str:
    """An endpoint's name: `method` against `other` at `fraction` of LoRA's gain (on one source, or the drift)."""
    what = "log drift ratio" if source is None else f"log KL ratio on {source}"
    return f"{percent(fraction)}: {method} vs {other}, {what}"


class RealAtlasCompareDesign(SharedSeedExperiment):
    """The design; each model's experiment names itself, its settings, its model in the claims' scope, how its
    learning rates were fixed (a selection rule), its pilot and its plan's notes."""

    version = "2"
    settings_class = RealAtlasCompareSettings
    model_words: ClassVar[str]  # the claims' scope

    @property
    def others(self) -> list[str]:
        return [method for method in self.settings.methods if method != METHOD]

    def scope(self) -> str:
        s = self.settings
        return (f"on {self.model_words} learning Python code, at {percent(PRIMARY_FRACTION)} of LoRA's gain within "
                f"{s.max_steps} steps of {s.batch_size} rows ({len(s.seeds)} seeds, {s.held_out_rows} test rows per "
                "retained source)")  # fmt: skip

    def claim(self, other: str) -> Claim:
        scope, words = self.scope(), WORDS[other]
        return Claim(
            scope,
            f"An ATLAS adapter drifted less on retained text than {words} at the same gain, {scope}.",
            f"An ATLAS adapter against {words}, drift on retained text at the same gain: {NOT_SIGNIFICANT}, {scope}.",
            f"{words[0].upper()}{words[1:]} drifted less on retained text than an ATLAS adapter at the same gain, "
            f"{scope}.",
        )

    def primaries(self) -> list[PrimaryEndpoint]:
        return [
            PrimaryEndpoint(
                ratio_name(PRIMARY_FRACTION, METHOD, other),
                f"ln(drift_atlas / drift_{other}) on test, each read where its run first reaches "
                f"{percent(PRIMARY_FRACTION)} of LoRA's validation gain (kinfolk compare's analysis of the seed: the "
                "one matching rule, interpolated along the curve); drift is the geometric mean over chat, prose and "
                "docs of KL(frozen || current) per token",
                other, "lower", claim=self.claim(other),
            )
            for other in self.others
        ]  # fmt: skip

    def exploratory(self) -> list[ExploratoryEndpoint]:
        s, endpoints = self.settings, []
        for fraction in s.levels:
            for other in self.others:
                if fraction != PRIMARY_FRACTION:
                    endpoints.append(ExploratoryEndpoint(ratio_name(fraction, METHOD, other), "as the primaries, at "
                                                         "this level", other, "lower"))  # fmt: skip
            for other in self.others:
                if other != BASELINE:
                    endpoints.append(ExploratoryEndpoint(ratio_name(fraction, other, BASELINE),
                                                         "kinfolk compare's own line for this method", BASELINE,
                                                         "lower"))  # fmt: skip
        for other in self.others:
            for source in self.sources:
                endpoints.append(ExploratoryEndpoint(ratio_name(PRIMARY_FRACTION, METHOD, other, source),
                                                     "ln(KL_atlas / KL_other) on that source's test rows alone",
                                                     other, "lower"))  # fmt: skip
            endpoints.append(ExploratoryEndpoint(
                f"{percent(PRIMARY_FRACTION)}: atlas - {other}, forgetting",
                "PEFT's forgetting figure: the retained NLL per token on test where the run reaches the level minus "
                "at step 0, mean over the sources; ATLAS's minus the other's", other, "lower"))  # fmt: skip
            endpoints.append(ExploratoryEndpoint(
                f"{percent(PRIMARY_FRACTION)}: atlas - {other}, test gain",
                "the test target's gain (score per token) where the run reaches the level on validation, from step 0; "
                "ATLAS's minus the other's: whether the validation match holds on test (added after the primaries "
                "were read)", other))  # fmt: skip
        for method in s.methods:
            if method != BASELINE:
                endpoints.append(ExploratoryEndpoint(f"reach: {method}", "the share of LoRA's validation gain the "
                                                     "method reaches", BASELINE, null=1.0))  # fmt: skip
        endpoints.append(ExploratoryEndpoint(f"chosen: {OUTPUT_KL} strength", "Output-KL's strength chosen on "
                                             "validation (log10)", null=0.0))  # fmt: skip
        return endpoints

    @property
    def sources(self) -> tuple[str, ...]:
        from kinfolk.lab.methods.real_atlas_compare.data import RETAINED

        return RETAINED

    def units(self) -> list[int]:
        return list(self.settings.seeds)

    def selection_rules(self) -> dict[str, str]:
        s = self.settings
        return {
            "levels": "validation: fractions (levels) of LoRA's gain on the seed, kinfolk compare's scale (start: "
            "LoRA's step-0 score; reference: its best)",
            "matching": "validation: the point where each run first reaches a level, interpolated along its running-"
            "maximum envelope (kinfolk.drift.levels, the one matching rule); the test drift is read there",
            "output-kl strength": f"validation: kinfolk compare's rate rule over the strengths {s.output_kl_coefs} "
            f"(least drift at {percent(s.selection_fraction)} of LoRA's gain; ties to the lower), the grid extended "
            f"by one step beyond the chosen end while the choice sits on an edge, at most {s.output_kl_extensions} "
            "times; a choice left on the edge flags its comparisons",
        }

    def runs_class(self) -> type[SeedRuns]:
        from kinfolk.lab.methods.real_atlas_compare.runs import RealAtlasCompareRuns

        return RealAtlasCompareRuns

    def select(self, view: SelectionView) -> dict[str, Any]:
        from kinfolk.lab.methods.real_atlas_compare.verdicts import choose_strength
        from kinfolk.stats import on_grid_edge

        coef = choose_strength(view, self.settings.selection_fraction)
        return {"output_kl_coef": coef, "grid_edge": on_grid_edge(coef, sorted(view["output_kl_coefs"]))}

    def analyse(self, record: Mapping[str, Any], selection: dict[str, Any]) -> dict[str, EndpointValue]:
        from kinfolk.lab.methods.real_atlas_compare.verdicts import (
            forgetting,
            seed_comparison,
            source_drifts,
            test_gains,
        )

        s, coef = self.settings, selection["output_kl_coef"]
        comparison = seed_comparison(record, coef, s.selection_fraction, s.levels)
        values: dict[str, EndpointValue] = {}
        for verdict in comparison.verdicts:
            edge = selection["grid_edge"] and OUTPUT_KL in (verdict.method, verdict.baseline)
            name = ratio_name(verdict.fraction, verdict.method, verdict.baseline)
            value = None if verdict.ratio is None else math.log(verdict.ratio)
            values[name] = EndpointValue(value, verdict.drift, verdict.baseline_drift, edge)
        level = next(level for level in comparison.analysis.levels if level.fraction == PRIMARY_FRACTION)
        drifts = source_drifts(comparison, level)
        changes = {"forgetting": forgetting(comparison, level), "test gain": test_gains(comparison, level)}
        for other in self.others:
            edge = selection["grid_edge"] and other == OUTPUT_KL
            for source in self.sources:
                ours, theirs = drifts[METHOD][source], drifts[other][source]
                value = None if not (ours and theirs) else math.log(ours / theirs)
                values[ratio_name(PRIMARY_FRACTION, METHOD, other, source)] = EndpointValue(value, ours, theirs, edge)
            for name, found in changes.items():
                ours, theirs = found[METHOD], found[other]
                value = None if ours is None or theirs is None else ours - theirs
                values[f"{percent(PRIMARY_FRACTION)}: atlas - {other}, {name}"] = EndpointValue(
                    value, ours, theirs, edge
                )
        for method, reached in comparison.analysis.reached.items():
            if method != BASELINE:
                values[f"reach: {method}"] = EndpointValue(reached)
        values[f"chosen: {OUTPUT_KL} strength"] = EndpointValue(math.log10(coef), grid_edge=selection["grid_edge"])
        return values

    def floor(self, endpoint: str) -> float | None:
        """Under a drift ratio: the largest step-0 (untrained adapter) test drift of the two methods over the kept
        seeds (None until every seed is kept)."""
        if "log drift ratio" not in endpoint:
            return None
        methods = endpoint.split(": ", 1)[1].split(",")[0].split(" vs ")
        floors = []
        for seed in self.settings.seeds:
            record = self.kept(seed)
            if record is None:
                return None
            floors += [point[2] for run in record["runs"].values() if run["method"] in methods
                       for point in run["test"]["drift"] if point[0] == 0]  # fmt: skip
        return max(floors)

    def provenance(self) -> dict[str, Any]:
        return {"records": self.settings.records}
