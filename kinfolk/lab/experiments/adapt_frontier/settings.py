"""What the adapt-frontier plan fixes before its runs: the teacher's depth, the student, the budget, the arms, what is
scored and the routing grid.

>>> settings = FrontierSettings()
>>> settings.blocks(), settings.depths()  # equal blocks: every size k < M has its own depth
([(0, 3), (3, 6), (6, 9), (9, 12)], [4, 6, 8, 10, 12])
>>> settings.adapt_settings().routing_variant, settings.distillation_seed(family=3, run=1)
('large_instruct', 301)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinfolk.lab.methods.adapt.settings import AdaptRunSettings, TeacherDepthSettings
from kinfolk.lab.methods.selection import threshold_grid
from kinfolk.lab.protocol.settings import FamilySettings

# The answer format the base student's SFT phase is taught in, per arm of the base student: the preferred one (also
# large_instruct's, versions 1-3) and large_bracket's (the format arm).
BASE_SFT_FORMATS = {"preferred-sft": "large_instruct", "bracket-sft": "large_bracket"}
# Every method whose sizes are measured, and the student its variant's blocks are patched into.
METHODS = {
    "distilled": "the variant's own two-phase student, ADAPT's loss (cross-entropy, KL and block cosine)",
    "ce-only": "the variant's own two-phase student trained on the same rows, in the same order, with the same "
    "steps and schedule, on cross-entropy alone (kl_weight 0, cosine_weight 0)",
    "weight-delta": "the variant's init + the base's two-phase delta, its SFT phase on the disjoint corpus in the "
    "preferred format (large_instruct's)",
    "cross-patch": "the variant's blocks patched into that base student",
    "weight-delta/bracket-sft": "the variant's init + the delta of a base student whose SFT phase answered the same "
    "problems in large_bracket's format (the format arm)",
    "cross-patch/bracket-sft": "the variant's blocks patched into that base student (the format arm)",
}


@dataclass(frozen=True)
class FrontierSettings(TeacherDepthSettings, AdaptRunSettings, FamilySettings):
    variants: list[str] = field(
        default_factory=lambda: ["large_instruct", "large_bracket"], metadata={"help": "Post-trained variants."}
    )
    teacher_layers: int = field(
        default=12,
        metadata={"help": "Layers of every ADAPT family's teacher (versions 1-3: 8), so that a student of equal "
                  "blocks patches back through sizes of 4 or more distinct depths."},
    )  # fmt: skip
    layers: str = field(
        default="{every: 3}",
        metadata={"help": "Teacher layers of every student (YAML layer selection): 0, 3, 6, 9 of 12, four blocks "
                  "of 3 layers, so size k has depth 4 + 2k whatever the patch order."},
    )  # fmt: skip
    steps: int = field(
        default=50,
        metadata={"help": "Steps of every distillation and ce-only student: the longest budget the pilot tried at "
                  "which the distilled student still trailed its teacher on validation by more than 0.1 (0.780 "
                  "against 0.998; 0.925 at 75 steps, 0.988 at 100, 0.995 at 150)."},
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
    threshold_step: float = field(
        default=0.02, metadata={"help": "Step of the routing threshold's calibration grid, from 0 to 1."}
    )
    threshold_extension: int = field(
        default=5,
        metadata={"help": "Steps the threshold grid may be extended beyond each end while the calibration choice lies "
                  "at an end (every run routes at the whole extended grid)."},
    )  # fmt: skip
    work: str = field(default="runs/adapt-frontier", metadata={"help": "Where each run's models are kept."})
    records: str = field(
        default="docs/results/adapt-frontier-families", metadata={"help": "Where each run's record is committed."}
    )
    family_overrides: dict = field(
        default_factory=dict, metadata={"help": "LabConfig fields over the ADAPT family (the tests' micro family)."}
    )

    def thresholds(self) -> list[float]:
        """Every threshold a run routes at: 0 to 1 by `threshold_step`, `threshold_extension` steps beyond."""
        return threshold_grid(self.threshold_step, self.threshold_extension)
