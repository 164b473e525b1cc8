"""One family's adapt-compute runs: per distillation seed (a run), each variant's distilled student, its
cross-entropy student at equal steps, at equal training FLOPs and climbed up the budget ladder until its validation
accuracy stops improving, each patched back to every size and measured.

The ladder is climbed in the run, as early stopping would: each budget trains a cross-entropy student from the init
(its own schedule), its unpatched student is measured on validation, and the climb stops at the first budget that
does not improve on the best so far by more than the plan's tolerance (`kinfolk.lab.methods.compute.converged_budget`); the record keeps
every rung's validation accuracy so the selection stage re-derives the choice. Models are kept under
`settings.work/<family>/run<r>/` (`kinfolk.lab.methods.adapt.AdaptFamily`, so a budget trained once is reused by
every arm that needs it); a process claims the whole run while it makes it, and the record goes to
`settings.records/<family>/<run>.json` once whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kinfolk.lab.methods.compute import converged_budget, multiplying_parameters
from kinfolk.lab.methods.selection import sizes_with_skills
from kinfolk.lab.protocol.family_runs import ClaimedFamilyRuns

RECORD_VERSION = 1
# Each arm's student: its loss and its budget, by the settings' field that fixes it (the ladder's: the converged one).
ARMS = {
    "distilled": ("distilled", "steps"),
    "ce-only/equal-steps": ("ce-only", "steps"),
    "ce-only/equal-flops": ("ce-only", "equal_flops_steps"),
    "ce-only/converged": ("ce-only", None),
}


class AdaptComputeRuns(ClaimedFamilyRuns):
    """The runs of the settings' families, made or read back; `None` for a run another process holds."""

    record_version = RECORD_VERSION
    name = "adapt-compute"

    def students(self, family, run: int, where: Path):
        """The run's `AdaptFamily` (its base student is never trained here: no transfer arm)."""
        from kinfolk.lab.methods.adapt.family_runs import AdaptFamily

        s = self.settings
        seed = s.distillation_seed(family.config.seed, run)
        return AdaptFamily(family, where, s.adapt_settings(), seed=seed, scored=s.scored)

    def ladder(self, students, variant: str) -> list[dict[str, Any]]:
        """The cross-entropy student's validation accuracy at each budget, climbed until it stops improving."""
        s, climbed = self.settings, []
        for steps in s.ce_budgets:
            student = students.student("ce-only", variant, steps)
            climbed.append({"steps": steps, "validation": students.measure(student, variant)["validation"]})
            ladder = [(rung["steps"], rung["validation"]) for rung in climbed]
            if len(climbed) > 1 and not converged_budget(ladder, s.stop_tolerance)[1]:
                break
        return climbed

    def make(self, seed: int, run: int, where: Path) -> dict[str, Any]:
        from kinfolk.lab.world.members import model_config

        s = self.settings
        family = s.family(seed)
        students = self.students(family, run, where)
        ladders, curves = {}, {}
        for variant in s.variants:
            ladders[variant] = self.ladder(students, variant)
            converged, _ = converged_budget(
                [(r["steps"], r["validation"]) for r in ladders[variant]], s.stop_tolerance
            )
            budgets = {arm: getattr(s, field) if field else converged for arm, (_, field) in ARMS.items()}
            curves[variant] = {
                arm: sizes_with_skills(students.curve(loss, variant, budgets[arm]), s.scored)
                for arm, (loss, _) in ARMS.items()
            }
        teacher = model_config(family.config.large_shape, family.tokenizer())
        return {
            "record_version": RECORD_VERSION,
            "family": seed,
            "run": run,
            "teacher_layers": teacher.num_hidden_layers,
            "blocks": [list(block) for block in s.blocks()],
            "parameters": {  # the weights each multiplies per token: what a step's FLOPs are counted from
                "student": multiplying_parameters(teacher, layers=len(s.blocks())),
                "teacher": multiplying_parameters(teacher),
            },
            "ladder": ladders,
            "curves": curves,
        }
