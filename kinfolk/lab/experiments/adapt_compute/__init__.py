"""adapt-compute (version 5 of the ADAPT question): distillation against cross-entropy alone at equal training
compute, and against a cross-entropy student trained until its validation accuracy stops improving.

Modules, in the order a run uses them: `settings` (what the plan fixes, and the training FLOPs that set the
equal-compute budget), `runs` (one family's runs: students, the cross-entropy budget ladder, sizes and measurements,
kept as records) and `experiment` (endpoints, the validation-only choices and the analysis). Families, students and
patching are version 4's (`kinfolk.lab.methods.adapt`: `TeacherDepthSettings`, `AdaptFamily`).

>>> from kinfolk.lab.experiments.adapt_compute import ComputeSettings
>>> ComputeSettings().steps, ComputeSettings().equal_flops_steps
(50, 100)
"""

from kinfolk.lab.experiments.adapt_compute.settings import ComputeSettings

__all__ = ["ComputeSettings"]
