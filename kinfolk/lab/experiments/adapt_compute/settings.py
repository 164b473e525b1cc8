"""What the adapt-compute plan fixes before its runs: version 4's families, student and distillation budget, the
cross-entropy student's budget at equal training FLOPs (`kinfolk.lab.methods.compute`), and the budget ladder it
climbs until its validation accuracy stops improving.

>>> settings = ComputeSettings()
>>> settings.steps, settings.equal_flops_steps, settings.ce_budgets[:3]
(50, 100, [50, 100, 150])
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinfolk.lab.methods.adapt.settings import AdaptRunSettings, TeacherDepthSettings
from kinfolk.lab.protocol.settings import FamilySettings


@dataclass(frozen=True)
class ComputeSettings(TeacherDepthSettings, AdaptRunSettings, FamilySettings):
    variants: list[str] = field(
        default_factory=lambda: ["large_instruct", "large_bracket"], metadata={"help": "Post-trained variants."}
    )
    teacher_layers: int = field(default=12, metadata={"help": "Layers of every family's teacher (version 4's)."})
    layers: str = field(
        default="{every: 3}", metadata={"help": "Teacher layers of every student: 0, 3, 6, 9 of 12 (version 4's)."}
    )
    steps: int = field(default=50, metadata={"help": "Steps of every distilled student (version 4's budget)."})
    equal_flops_steps: int = field(
        default=100,
        metadata={"help": "Steps of the cross-entropy student at the distilled student's training FLOPs: "
                  "`equal_flops_steps(steps, N_student, N_teacher)` for the plan's 4-layer student of a 12-layer "
                  "teacher (ratio 1.99); a test recomputes it from the lab model's weights."},
    )  # fmt: skip
    ce_budgets: list[int] = field(
        default_factory=lambda: [50, 100, 150, 200, 300, 400, 600],
        metadata={"help": "The cross-entropy student's budget ladder: it is trained at each in turn until its "
                  "validation accuracy stops improving (`stop_tolerance`)."},
    )  # fmt: skip
    stop_tolerance: float = field(
        default=0.005,
        metadata={"help": "A budget whose unpatched student is no more than this above the best validation accuracy "
                  "so far stops the ladder; the best so far is the converged student."},
    )  # fmt: skip
    learning_rate: float = field(default=2e-3, metadata={"help": "Peak learning rate of every student."})
    pretraining_fraction: float = field(default=0.5, metadata={"help": "Share of each student's steps on text."})
    batch_size: int = field(default=32, metadata={"help": "Rows per training step."})
    scored: list[str] = field(
        default_factory=lambda: ["reverse", "reverse_graded"],
        metadata={"help": "Skills every size is scored on (accuracy in the variant's format, their mean)."},
    )
    eval_problems: int = field(default=200, metadata={"help": "Test problems per scored skill."})
    validation_problems: int = field(
        default=200, metadata={"help": "Validation problems per scored skill (patch orders, the ladder's stop)."}
    )
    kl_examples: int = field(default=256, metadata={"help": "Test-split examples for KL(variant || size)."})
    work: str = field(default="runs/adapt-compute", metadata={"help": "Where each run's models are kept."})
    records: str = field(
        default="docs/results/adapt-compute-families", metadata={"help": "Where each run's record is committed."}
    )
    family_overrides: dict = field(
        default_factory=dict, metadata={"help": "LabConfig fields over the ADAPT family (the tests' micro family)."}
    )
