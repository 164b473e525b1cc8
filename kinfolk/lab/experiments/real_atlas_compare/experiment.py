"""real-atlas version 2 on SmolLM2-135M-Instruct: the design of `kinfolk.lab.methods.real_atlas_compare.design`,
its rates fixed by a pilot seed (`pilot`), its plan's notes in `notes`.

>>> RealAtlasCompare().name, RealAtlasCompare.model_words
('real-atlas-compare', 'SmolLM2-135M-Instruct')
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kinfolk.lab.methods.real_atlas_compare.design import PRIMARY_FRACTION, RealAtlasCompareDesign
from kinfolk.lab.protocol.plan import CLAIMS_SCHEMA

__all__ = ["PRIMARY_FRACTION", "RealAtlasCompare"]


class RealAtlasCompare(RealAtlasCompareDesign):
    name = "real-atlas-compare"
    model_words = "SmolLM2-135M-Instruct"

    def selection_rules(self) -> dict[str, str]:
        return {
            **super().selection_rules(),
            "learning rates": "fixed by the pilot (seed 999, not a unit): see the notes",
        }

    def pilot(self) -> Callable[[], Path | None]:
        from kinfolk.lab.experiments.real_atlas_compare.pilot import run_pilot

        return lambda: run_pilot(self.settings)

    def plan_fields(self) -> dict[str, Any]:
        from kinfolk.lab.experiments.real_atlas_compare.notes import NOTES

        return {"schema": CLAIMS_SCHEMA, "notes": NOTES}
