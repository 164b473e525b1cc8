"""real-atlas version 2 on a second model, Gemma-3-270m (base): real-atlas-compare's question, data rule, budget,
measures and primaries, reduced for cost to LoRA, ATLAS and LoRA + Output-KL with LoRA's and ATLAS's rates chosen per
seed on validation (`notes`). Its claims name this model.

>>> [e.name for e in RealAtlasCompareGemma().primaries()]
['50%: atlas vs lora, log drift ratio', '50%: atlas vs lora_output_kl, log drift ratio']
"""

from __future__ import annotations

from typing import Any

from kinfolk.lab.experiments.real_atlas_compare_gemma.settings import RealAtlasCompareGemmaSettings
from kinfolk.lab.methods.real_atlas_compare.design import RealAtlasCompareDesign, percent
from kinfolk.lab.protocol.plan import CLAIMS_SCHEMA


class RealAtlasCompareGemma(RealAtlasCompareDesign):
    """The same question and design on a second model, Gemma-3-270m (base), reduced for cost to LoRA, ATLAS and
    LoRA + Output-KL, with LoRA's and ATLAS's rates chosen per seed on validation (`notes`)."""

    name = "real-atlas-compare-gemma"
    settings_class = RealAtlasCompareGemmaSettings
    model_words = "Gemma-3-270m (base)"

    def selection_rules(self) -> dict[str, str]:
        return {
            **super().selection_rules(),
            "learning rates": "validation: kinfolk compare's rate rule over each method's grid (least drift at "
            f"{percent(self.settings.selection_fraction)} of LoRA's gain among the rates that reach it, else the "
            "highest best score, ties to the lower rate); the levels' reference is LoRA's best score over its rates",
        }

    def plan_fields(self) -> dict[str, Any]:
        from kinfolk.lab.experiments.real_atlas_compare_gemma.notes import NOTES

        return {"schema": CLAIMS_SCHEMA, "notes": NOTES}
