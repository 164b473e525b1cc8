"""One family's adapt-controls runs: per distillation seed (a run), every method's sizes measured and routed.

A run distils each variant's own student, the base's student with its SFT phase on the disjoint corpus
(`kinfolk.lab.methods.adapt.base_corpus`) and, for the circular arm, the base's student on version 1's corpus (large_instruct's own
post-training rows); patches every size of every method back in both orders (`kinfolk.lab.methods.adapt.AdaptFamily`,
models kept under `settings.work/<family>/run<r>/`), measures them and routes graded reversal over the routing
variant's distilled and weight-delta sizes. A process claims the whole run while it makes it
(`kinfolk.claims`), so processes started alike share the runs; the record goes to
`settings.records/<family>/<run>.json` once whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kinfolk.lab.methods.adapt.base_corpus import VARIANTS, base_sft_corpus, variant_post_training_prompts
from kinfolk.lab.methods.adapt.settings import BASE, ROUTED, format_of
from kinfolk.lab.methods.selection import routing_record, sizes_with_skills
from kinfolk.lab.protocol.family_runs import ClaimedFamilyRuns

RECORD_VERSION = 1


class AdaptControlsRuns(ClaimedFamilyRuns):
    """The runs of the settings' families, made or read back; `None` for a run another process holds."""

    record_version = RECORD_VERSION
    name = "adapt-controls"

    def family(self, seed: int):
        from kinfolk.lab.methods.adapt.settings import adapt_family_config
        from kinfolk.lab.world.family import build_family

        return build_family(adapt_family_config(seed, **self.settings.family_overrides), progress=False)

    def make(self, seed: int, run: int, where: Path) -> dict[str, Any]:
        from kinfolk.lab.methods.adapt.family_runs import AdaptFamily

        s = self.settings
        family = self.family(seed)
        adapt = s.adapt_settings()
        common = {"seed": s.distillation_seed(seed, run), "scored": s.scored}
        disjoint = AdaptFamily(family, where / "disjoint", adapt, **common,
                               base_sft=lambda n: base_sft_corpus(family, n))  # fmt: skip
        circular = AdaptFamily(family, where / "circular", adapt, **common)  # version 1's base corpus
        curves: dict[str, Any] = {}
        for variant in s.variants:
            made = {m: disjoint.curve(m, variant, s.steps) for m in ("distilled", "weight-delta", "cross-patch")}
            if s.circular_arm:
                made["weight-delta-circular"] = circular.curve("weight-delta", variant, s.steps)
            curves[variant] = {method: sizes_with_skills(curve, s.scored) for method, curve in made.items()}
        routed = disjoint.routing()
        return {
            "record_version": RECORD_VERSION,
            "family": seed,
            "run": run,
            "corpus": self.corpus_overlap(family, disjoint, circular),
            "curves": curves,
            "routing": {m: routing_record(routed[m], s.routing_policy) for m in ROUTED},
        }

    def corpus_overlap(self, family, disjoint, circular) -> dict[str, Any]:
        """Share of each base corpus's SFT prompts among the variants' post-training prompts (per variant)."""
        corpora = {name: run.training_data(BASE, "two-phase", self.settings.steps)[1]
                   for name, run in (("disjoint", disjoint), ("circular", circular))}  # fmt: skip
        shares = {}
        for variant in VARIANTS:
            theirs = variant_post_training_prompts(family, [variant])
            shares[variant] = {name: sum(p in theirs for p in rows["prompt"]) / len(rows)
                               for name, rows in corpora.items()}  # fmt: skip
        return {"rows": len(corpora["disjoint"]), "format": format_of(BASE), "shared_prompts": shares}
