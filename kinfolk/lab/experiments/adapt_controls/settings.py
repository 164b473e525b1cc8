"""What the adapt-controls plan fixes before its runs: the variants, the student, the budget, what is scored.

>>> settings = ControlsSettings()
>>> settings.adapt_settings().routing_variant, settings.distillation_seed(family=3, run=1)
('large_instruct', 301)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinfolk.lab.methods.adapt.settings import AdaptRunSettings
from kinfolk.lab.protocol.settings import FamilySettings

# Every method whose sizes are measured, and the student its variant's blocks are patched into.
METHODS = {
    "distilled": "the variant's own two-phase student (ADAPT (distilled))",
    "weight-delta": "the variant's init + the base's two-phase delta, its SFT phase on the disjoint corpus",
    "cross-patch": "the variant's blocks patched into the base's two-phase student (disjoint corpus)",
    "weight-delta-circular": "the variant's init + the delta of a base student whose SFT phase read large_instruct's "
    "own post-training rows (version 1's corpus)",
}


@dataclass(frozen=True)
class ControlsSettings(AdaptRunSettings, FamilySettings):
    variants: list[str] = field(
        default_factory=lambda: ["large_instruct", "large_bracket"], metadata={"help": "Post-trained variants."}
    )
    layers: str = field(
        default="{every: 4, last: 1}",
        metadata={"help": "Teacher layers of every student (YAML layer selection): 0, 4, 7, blocks [0, 4), [4, 7), "
                  "[7, 8); the pilot's 5- and 4-layer students matched their teacher by 150-300 steps."},
    )  # fmt: skip
    steps: int = field(
        default=150,
        metadata={"help": "Steps of every distillation: the longest budget at which the pilot's 3-layer student "
                  "still trailed its teacher (0.83 against 1.00; it matched at 300)."},
    )  # fmt: skip
    learning_rate: float = field(default=2e-3, metadata={"help": "Peak learning rate of every distillation."})
    pretraining_fraction: float = field(default=0.5, metadata={"help": "Share of the steps on pre-training text."})
    batch_size: int = field(default=32, metadata={"help": "Rows per distillation step."})
    scored: list[str] = field(
        default_factory=lambda: ["reverse", "reverse_graded"],
        metadata={"help": "Skills every size is scored on (accuracy in the variant's format, mean over them)."},
    )
    eval_problems: int = field(default=200, metadata={"help": "Test problems per scored skill."})
    validation_problems: int = field(default=200, metadata={"help": "Validation problems per scored skill."})
    kl_examples: int = field(default=256, metadata={"help": "Test-split examples for KL(variant || size)."})
    routing_problems: int = field(
        default=60, metadata={"help": "Graded-reversal problems per length in each routing split."}
    )
    routing_variant: str = field(default="large_instruct", metadata={"help": "Variant whose families are routed."})
    routing_policy: str = field(default="average", metadata={"help": "Routing policy of the primaries."})
    circular_arm: bool = field(
        default=True, metadata={"help": "Also measure weight-delta from version 1's circular base corpus."}
    )
    work: str = field(default="runs/adapt-controls", metadata={"help": "Where each run's models are kept."})
    records: str = field(
        default="docs/results/adapt-controls-families", metadata={"help": "Where each run's record is committed."}
    )
    family_overrides: dict = field(
        default_factory=dict, metadata={"help": "LabConfig fields over the ADAPT family (the tests' micro family)."}
    )
