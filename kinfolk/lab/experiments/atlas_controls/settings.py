"""What the atlas-controls plan fixes before its runs: the methods and their grids, the drift sources, the budget.

Every method adapts the same module (the attention output projection of the 8-layer large base's layer at the
paper's relative depth) at rank 4 (OSF: as many trained singular directions) and learns each target skill from the
frozen model; each run is measured at step 0 (the untrained adapter: the floor its numerical path leaves) and every
`checkpoint_every` steps.

>>> settings = ControlsSettings()
>>> settings.runs_of("lora")[:2], settings.runs_of("lora+output-kl")[-1]
([(0.0003, None), (0.001, None)], (0.003, 30.0))
>>> len([run for method in settings.methods for run in settings.runs_of(method)])
32
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinfolk.lab.methods.atlas.settings import TARGETS
from kinfolk.lab.protocol.settings import FamilySettings

# The atlas is fitted on copy answers in the preferred format: `copy` is its own template, the rest are not.
ATLAS_SOURCE = "copy"
OTHER_SOURCES = ("copy-formats", "add", "text")
SOURCES = (ATLAS_SOURCE, *OTHER_SOURCES)
REGULARISED = {"lora+output-kl": "output_kl_coefs", "lora+replay": "replay_ratios"}


@dataclass(frozen=True)
class ControlsSettings(FamilySettings):
    targets: list[str] = field(default_factory=lambda: list(TARGETS), metadata={"help": "Target skills."})
    methods: list[str] = field(
        default_factory=lambda: [
            "lora", "atlas", "norm-matched", "distance-scaled", "pca-scaled", "osf", "lora+output-kl", "lora+replay",
        ],
        metadata={"help": "Methods: LoRA, ATLAS, its step-size control and two mechanism ablations, OSF, and LoRA "
                  "with each regulariser."},
    )  # fmt: skip
    learning_rates: list[float] = field(
        default_factory=lambda: [3e-4, 1e-3, 3e-3, 1e-2, 3e-2],
        metadata={"help": "Rates of LoRA, ATLAS and the norm-matched control (3e-4: version 1's LoRA chose 1e-3, "
                  "its lowest, in 3 of 5 flip families)."},
    )  # fmt: skip
    ablation_learning_rates: list[float] = field(
        default_factory=lambda: [1e-3, 1e-2, 3e-2], metadata={"help": "Rates of the two mechanism ablations."}
    )
    osf_learning_rates: list[float] = field(
        default_factory=lambda: [3e-3, 3e-2, 1e-1],
        metadata={"help": "Rates of OSF (it trains the smallest singular directions: real-atlas's pilot needed "
                  "higher rates)."},
    )  # fmt: skip
    regularised_learning_rate: float = field(default=3e-3, metadata={"help": "Rate of LoRA + Output-KL / Replay."})
    output_kl_coefs: list[float] = field(
        default_factory=lambda: [1.0, 3.0, 10.0, 30.0],
        metadata={"help": "Output-KL strengths λ (version 1 chose its top, 3, every time)."},
    )
    replay_ratios: list[float] = field(
        default_factory=lambda: [0.02, 0.05, 0.1, 0.25],
        metadata={"help": "Replay shares (version 1 chose its bottom, 0.1, every time)."},
    )
    gain_levels: dict = field(
        default_factory=lambda: {"mid": 0.5, "high": 0.75},
        metadata={"help": "Levels where methods are compared, as fractions of LoRA's best validation gain."},
    )
    steps: int = field(default=100, metadata={"help": "Optimiser steps of every run (cosine schedule)."})
    checkpoint_every: int = field(
        default=20, metadata={"help": "Steps between measured checkpoints (a measurement costs more than 20 steps)."}
    )
    validation_problems: int = field(default=50, metadata={"help": "Validation problems of the target skill."})
    eval_problems: int = field(default=100, metadata={"help": "Test problems of the target skill."})
    kl_contexts: int = field(default=64, metadata={"help": "Rows per drift source and split."})
    work: str = field(default="runs/atlas-controls", metadata={"help": "Where each run's result is kept."})
    records: str = field(
        default="docs/results/atlas-controls-families", metadata={"help": "Where each run's record is committed."}
    )
    family_overrides: dict = field(
        default_factory=dict, metadata={"help": "LabConfig fields over the ATLAS family (the tests' micro family)."}
    )

    def runs_of(self, method: str) -> list[tuple[float, float | None]]:
        """(learning rate, strength) of each of the method's runs."""
        if method in REGULARISED:
            return [(self.regularised_learning_rate, s) for s in getattr(self, REGULARISED[method])]
        if method == "osf":
            rates = self.osf_learning_rates
        elif method in ("distance-scaled", "pca-scaled"):
            rates = self.ablation_learning_rates
        else:
            rates = self.learning_rates
        return [(rate, None) for rate in rates]

    def grid_of(self, method: str) -> list[float]:
        """The grid a method's selected run lies on (rates; strengths for the regularised)."""
        runs = self.runs_of(method)
        return [s for _, s in runs] if method in REGULARISED else [rate for rate, _ in runs]
