"""What the second model's plan fixes: real-atlas-compare's settings with Gemma-3-270m's model, methods, rate
grids and folders."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kinfolk.lab.methods.real_atlas_compare.settings import OUTPUT_KL, RealAtlasCompareSettings


@dataclass(frozen=True)
class RealAtlasCompareGemmaSettings(RealAtlasCompareSettings):
    """The second model's design: Gemma-3-270m (base), LoRA, ATLAS and LoRA + Output-KL (the norm-matched control
    left out for cost: `notes`), LoRA's and ATLAS's rates chosen per seed on validation from a grid of two
    (no pilot on this model fixed them; Output-KL keeps one rate, its strength chosen from a grid), every run on the
    machine's GPU where it has one and the CPU otherwise, fp32 either way.

    >>> settings = RealAtlasCompareGemmaSettings()
    >>> settings.model, settings.methods, settings.compare_options()["use_cpu"], settings.compare_options()["dtype"]
    ('gemma-3-270m', ['lora', 'atlas', 'lora_output_kl'], False, 'float32')
    """

    model: str = field(
        default="gemma-3-270m",
        metadata={"help": "a model directory, or a name under $KINFOLK_REAL_MODELS (make real-models)"},
    )
    methods: list[str] = field(
        default_factory=lambda: ["lora", "atlas", OUTPUT_KL],
        metadata={"help": "kinfolk compare's methods (its registry's names); the first is the baseline"},
    )
    learning_rates: dict = field(
        default_factory=lambda: {"lora": [1e-3, 3e-3], "atlas": [3e-3, 1e-2], OUTPUT_KL: [3e-3]},
        metadata={
            "help": "each method's learning-rate grid, chosen from per seed on validation by compare's rule "
            "(Output-KL's one rate: its strength is the grid chosen from)"
        },
    )
    work: str = field(
        default="runs/real-atlas-compare-gemma", metadata={"help": "data, runs and caches (not committed)"}
    )
    records: str = field(
        default="docs/results/real-atlas-compare-gemma-units",
        metadata={"help": "each seed's drawn rows and every run's drift.jsonl and run.json (committed)"},
    )

    def compare_options(self) -> dict[str, Any]:
        # a GPU where the machine has one, the CPU otherwise (compare falls back): fp32 on both, never mixed
        return {**super().compare_options(), "use_cpu": False}
