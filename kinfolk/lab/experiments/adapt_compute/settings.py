"""What the adapt-compute plan fixes before its runs: adapt-frontier's families, student and distillation budget, the
cross-entropy student's budget at equal training FLOPs, and the budget ladder it climbs until validation stops
improving.

A training step's FLOPs per token are about 2N for a forward and 4N for a backward of a model of N parameters that
multiply (every weight matrix, the output head included; the input embedding is a lookup): a cross-entropy step costs
6·N_student, a distillation step 6·N_student + 2·N_teacher (the teacher's forward gives the KL targets and the block
cosine's hidden states; nothing flows back through it). The sequence-length terms of attention are left out (rows of
at most 64 tokens against widths of 128).

>>> step_flops(1_000, 3_000, distilled=False), step_flops(1_000, 3_000, distilled=True)
(6000, 12000)
>>> equal_flops_steps(50, student=1_061_248, teacher=3_158_400)  # the plan's students: 4 of 12 layers
100
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinfolk.lab.methods.adapt.settings import AdaptRunSettings, TeacherDepthSettings
from kinfolk.lab.protocol.settings import FamilySettings


def step_flops(student: int, teacher: int, distilled: bool) -> int:
    """Training FLOPs per token of one step: the student's forward and backward, plus the teacher's forward when
    distilling (`student`, `teacher`: their multiplying parameters)."""
    return 6 * student + (2 * teacher if distilled else 0)


def equal_flops_steps(distilled_steps: int, student: int, teacher: int) -> int:
    """The cross-entropy steps that cost what `distilled_steps` distillation steps cost (nearest whole step)."""
    ratio = step_flops(student, teacher, True) / step_flops(student, teacher, False)
    return round(distilled_steps * ratio)


def multiplying_parameters(shape: dict, vocabulary: int) -> int:
    """The parameters a lab model of `shape` multiplies per token: per layer the attention projections (4 d², as many
    key-value heads as heads) and the gated MLP (3 d i), and the output head (d V); norms and the embedding lookup
    add no multiply-accumulate worth counting."""
    d, i = shape["hidden_size"], shape["intermediate_size"]
    return shape["num_hidden_layers"] * (4 * d * d + 3 * d * i) + d * vocabulary


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


def converged_budget(ladder: list[tuple[int, float]], tolerance: float) -> tuple[int, bool]:
    """From (budget, validation accuracy) in climbing order, as far as it was climbed: the budget with the best
    accuracy before the first that failed to improve on it by more than `tolerance`, and whether the ladder ran out
    first (the choice is then its last budget, on the grid's edge).

    >>> converged_budget([(50, 0.02), (100, 0.87), (150, 0.81)], 0.005)
    (100, False)
    >>> converged_budget([(50, 0.02), (100, 0.5)], 0.005)
    (100, True)
    """
    best_steps, best = ladder[0]
    for steps, accuracy in ladder[1:]:
        if accuracy <= best + tolerance:
            return best_steps, False
        best_steps, best = steps, accuracy
    return best_steps, True
