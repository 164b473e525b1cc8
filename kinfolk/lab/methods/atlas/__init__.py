"""ATLAS in the lab: ATLAS against its comparators as drift-versus-gain Pareto fronts, over families.

The question: at equal gain on a target skill, does an ATLAS adapter move the model's retained behaviour less than
LoRA and LoRA's regularised variants, and is that more than taking smaller steps? Each family is one draw of the
world; inside it, every method learns each target skill from the
frozen large base:

- methods (`METHODS`): `lora`; `corda` (CorDA-KPM from the retained data); the ATLAS residuals `plain`, `centered`,
  `atlas` (full); `norm-matched` (the plain residual rescaled per token to the full residual's norm: the control that
  asks whether the filters matter beyond step size); `lora+replay` and `lora+output-kl` (`WeightedSFTTrainer`'s
  regularisers). All at one placement and rank: the attention output projection of the layer at mid depth (the
  paper's 17/36) of an 8-layer large base, rank 4 of width 128;
- target skills: `reverse` (reversal of letters, whose inputs overlap the retained skill's: copying letters) and
  `flip` (reversal of digits with its own prompt word: inputs far from the retained ones). The families' bases learn
  both in pre-training in every answer format (`FAMILY_SHARES`); what an adapter learns is to answer in the
  preferred one, so the frozen model starts well below the ceiling and every method can reach it;
- a shared learning-rate grid (`learning_rates`) for every method, and for Replay / Output-KL each strength
  (`replay_ratios`, `output_kl_coefs`) at each of a sparser grid of rates (`regularised_learning_rates`): one run
  per (method, rate, strength), measured every `checkpoint_every` steps, so each run traces a curve and no run is
  spent per target level.

Measured at every checkpoint, on validation and on test problems of the family's own seed: the target score
(correct answer in the preferred format), retained KL (KL(frozen ‖ current) on teacher-forced retained contexts,
against the original base, so CorDA's rewritten weight is no excuse), retained answer churn against the frozen model's
answers (F: correct → wrong answer content), and the effective update size (mean per-token norm of what the adapted
module adds to the original module's output) on target and on retained tokens. Retained contexts and churn problems
come from the validation and test splits, disjoint from each other and from the train-split rows that fit the atlas
and feed Replay and Output-KL.

Fronts (`fronts.analyse_target`). A method's front is, for each target level k, the lowest retained KL among its checkpoints
scoring at least k (likewise for F). Its runs are chosen on validation: the (rate, strength) configurations that attain
the method's validation front somewhere in the comparison range, plus the one that reaches its highest validation
score. The reported fronts use only those configurations' test measurements. Levels are fractions of LoRA's gain on
test: 0 is the frozen score, 1 LoRA's best test score (its plateau); the comparison range is `AREA_RANGE` of that gain,
the fixed levels `GAIN_LEVELS` (mid, near the plateau). A family where LoRA gains less than `MIN_GAIN` has no levels.

Version 1 (retired at the lab's one-layout change; its runner is at commit de49ff0) ran this over five families; the
registered `atlas` experiment (`kinfolk.lab.experiments.atlas`) re-analyses its committed records under protocol 2,
and `atlas-controls` (version 3) reuses the runs and measurement here.

>>> front([(0.2, 0.5), (0.4, 0.3), (0.6, 0.9)], 0.3)  # lowest measure among points scoring >= 0.3
0.3
>>> front([(0.2, 0.5)], 0.3) is None  # never reached
True

Modules: `settings` (names, `AtlasSettings`, the family), `runs` (measurement and training) and `fronts` (version 1's
analysis, which the demo reads).
"""

from kinfolk.lab.methods.atlas.fronts import analyse_target, front, gain_levels, log_ratio, mean_log_ratio, select_runs
from kinfolk.lab.methods.atlas.runs import Context, build_adapter, measure, prepare, train_run
from kinfolk.lab.methods.atlas.settings import (
    BASELINE,
    CONTROL,
    GAIN_LEVELS,
    METHODS,
    TARGETS,
    AtlasSettings,
    family_config,
)

__all__ = [
    "BASELINE",
    "CONTROL",
    "GAIN_LEVELS",
    "METHODS",
    "TARGETS",
    "AtlasSettings",
    "Context",
    "analyse_target",
    "build_adapter",
    "family_config",
    "front",
    "gain_levels",
    "log_ratio",
    "mean_log_ratio",
    "measure",
    "prepare",
    "select_runs",
    "train_run",
]
