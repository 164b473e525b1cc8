"""ADAPT in the lab: ADAPT as the paper runs it, over families (`docs/protocol.md`).

The family (`adapt_family_config`) has an 8-layer teacher, so a student of every other layer plus the last
(`{every: 2, last: 1}`: 5 layers, blocks [0, 2), [2, 4), [4, 6), [6, 7), [7, 8)) patches back through k = 0..5, four
intermediate models; its variants are also post-trained on graded reversal (2-6 letters), the routing task. Every
distillation is `kinfolk distil`'s (`kinfolk.plugins.adapt.distillation.distil_student`): init-student, then the
two phases of ADAPT §3.2 under one schedule — the family's pre-training text (every token: CE, KL, block cosine) for `pretraining_fraction`
of the steps, then the teacher's own SFT data (response tokens only) — and the delta. Per family, in the order the
issue asks for (`stages`):

1. **interpolation** (first): each variant's student distilled directly from it (ADAPT (distilled)) at every budget
   of `budgets`, patched back both ways (`kinfolk merge patch --all`, both orders); every size is measured —
   accuracy in the variant's format on the retained and target skills' test problems, KL(variant ‖ model) per
   response token, and the cosine to the variant per layer (each layer against the last teacher layer of its block)
   and per position of the final layer (App. D.1). Per size the order with the better validation accuracy is kept
   (the paper picks the better order per model; here on validation problems, not test ones).
2. **transfer** (at `steps`): the base student distilled from the base (two phases) gives the delta; per variant,
   ADAPT (weight-delta) = the variant's init + delta, patched back, against cross-patch (2-phase) = the variant's blocks
   patched into the distilled base student, and ADAPT (distilled) from stage 1; single-phase base deltas (pre-training
   only, SFT only; App. F.1) are the ablation; `delta-cosine` between each base delta and the variant's own delta
   (App. G) is reported beside the transfer's success.
3. **routing** (at `steps`): the graded-reversal problems of the validation split (calibration) and test split
   answered by every size of the routing variant's distilled and weight-delta families; `kinfolk route`
   (`kinfolk.plugins.adapt.outcomes.route_outcomes`, difficulty = word length, cost = parameters × tokens) picks
   per length the
   smallest size that clears each threshold and measures the frontier on the test split against every fixed size.

Version 1 (retired at the lab's one-layout change; its runner is at commit de49ff0) ran these stages over five
families; the registered `adapt` experiment (`kinfolk.lab.experiments.adapt`) re-analyses its committed records, and
`adapt-controls` (version 3) reuses the distillation and measurement here. The demo runs one family (`adapt_family`).

>>> AdaptSettings().stages
['interpolation', 'transfer', 'routing']

Modules: `settings` (names, `AdaptSettings`, the family, the curve statistics), `agreement` (KL and cosines to the
variant) and `family_runs` (`AdaptFamily`: one family's stages).
"""

from kinfolk.lab.methods.adapt.agreement import teacher_agreement
from kinfolk.lab.methods.adapt.family_runs import AdaptFamily, adapt_family
from kinfolk.lab.methods.adapt.settings import (
    METHODS,
    ORDERS,
    ROUTED,
    AdaptSettings,
    adapt_family_config,
    concordance,
    format_of,
    graded_problems,
    largest_drop,
)

__all__ = [
    "METHODS",
    "ORDERS",
    "ROUTED",
    "AdaptFamily",
    "AdaptSettings",
    "adapt_family",
    "adapt_family_config",
    "concordance",
    "format_of",
    "graded_problems",
    "largest_drop",
    "teacher_agreement",
]
