"""One family's adapt-frontier runs: per distillation seed (a run), every method's sizes measured and routed.

A run trains, per variant, its own student twice (ADAPT's loss, and cross-entropy alone on the same rows and
schedule) and two base students, whose SFT phases answer the same disjoint problems
(`kinfolk.lab.methods.adapt.base_corpus`) in the preferred format or in large_bracket's; patches every size of every
method back in both orders (`kinfolk.lab.methods.adapt.AdaptFamily`, models kept under
`settings.work/<family>/run<r>/`), measures them and routes graded reversal over the routing variant's distilled and
weight-delta sizes at the whole extended threshold grid. A process claims the whole run while it makes it
(`kinfolk.claims`), so processes started alike share the runs; the record goes to
`settings.records/<family>/<run>.json` once whole.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from kinfolk.lab.experiments.adapt_frontier.settings import BASE_SFT_FORMATS
from kinfolk.lab.methods.adapt.base_corpus import VARIANTS, base_sft_corpus, variant_post_training_prompts
from kinfolk.lab.methods.adapt.settings import BASE, ROUTED, format_of
from kinfolk.lab.methods.selection import routing_record, sizes_with_skills
from kinfolk.lab.protocol.family_runs import ClaimedFamilyRuns

RECORD_VERSION = 1
OWN_STUDENTS = ("distilled", "ce-only")  # measured from the preferred-sft folder (they do not read the base corpus)
BASE_STUDENTS = ("weight-delta", "cross-patch")  # measured once per base SFT format


class AdaptFrontierRuns(ClaimedFamilyRuns):
    """The runs of the settings' families, made or read back; `None` for a run another process holds."""

    record_version = RECORD_VERSION
    name = "adapt-frontier"

    def family(self, seed: int):
        return self.settings.family(seed)

    def arms(self, family, run: int, where: Path) -> dict[str, Any]:
        """One `AdaptFamily` per base SFT format (`BASE_SFT_FORMATS`), each under its own folder of `where`."""
        from kinfolk.lab.methods.adapt.family_runs import AdaptFamily

        s = self.settings
        common = {"seed": s.distillation_seed(family.config.seed, run), "scored": s.scored}
        return {
            arm: AdaptFamily(family, where / arm, s.adapt_settings(), **common,
                             base_sft=partial(base_sft_corpus, family, format_index=format_of(variant)))
            for arm, variant in BASE_SFT_FORMATS.items()
        }  # fmt: skip

    def make(self, seed: int, run: int, where: Path) -> dict[str, Any]:
        s = self.settings
        family = self.family(seed)
        arms = self.arms(family, run, where)
        preferred = arms["preferred-sft"]
        curves: dict[str, Any] = {}
        for variant in s.variants:
            made = {method: preferred.curve(method, variant, s.steps) for method in OWN_STUDENTS + BASE_STUDENTS}
            made |= {f"{method}/bracket-sft": arms["bracket-sft"].curve(method, variant, s.steps)
                     for method in BASE_STUDENTS}  # fmt: skip
            curves[variant] = {method: sizes_with_skills(curve, s.scored) for method, curve in made.items()}
        routed = preferred.routing(s.thresholds())
        return {
            "record_version": RECORD_VERSION,
            "family": seed,
            "run": run,
            "teacher_layers": family.config.large_shape["num_hidden_layers"],
            "blocks": [list(block) for block in s.blocks()],
            "base_sft": self.base_corpora(family, arms),
            "curves": curves,
            "routing": {m: routing_record(routed[m], s.routing_policy) for m in ROUTED},
        }

    def base_corpora(self, family, arms) -> dict[str, Any]:
        """Per base SFT arm: its rows, its format, and the share of its prompts among each variant's post-training
        prompts (0: the corpus is disjoint from both)."""
        corpora = {arm: run.training_data(BASE, "two-phase", self.settings.steps)[1] for arm, run in arms.items()}
        theirs = {variant: variant_post_training_prompts(family, [variant]) for variant in VARIANTS}
        described = {}
        for arm, rows in corpora.items():
            shares = {
                variant: sum(p in prompts for p in rows["prompt"]) / len(rows) for variant, prompts in theirs.items()
            }
            described[arm] = {"rows": len(rows), "format": format_of(BASE_SFT_FORMATS[arm]), "shared_prompts": shares}
        same = corpora["preferred-sft"]["prompt"] == corpora["bracket-sft"]["prompt"]
        return {"arms": described, "same_prompts": same}
