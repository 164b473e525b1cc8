"""The ADAPT lab experiment's settings, names and family, and the curve statistics of version 1."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
from datasets import Dataset

from kinfolk.lab.world import corpus
from kinfolk.lab.world.family import BRACKET_FORMAT, LabConfig
from kinfolk.lab.world.skills import ALL_SKILLS, GRADED, GRADED_LENGTHS, HELD_OUT, RETAINED, TARGET

BASE = "large_base"
SCORED = [RETAINED, TARGET]  # the accuracy of every size: the skills every variant is post-trained on
ORDERS = ("back-to-front", "front-to-back")
PHASES = ("two-phase", "pretraining", "sft")  # what a distillation trains on (F.1's single-phase deltas)
STAGES = ("interpolation", "transfer", "routing")
METHODS = {  # method of the transfer stage -> the student whose layers the variant's blocks are patched back into
    "distilled": "the variant's own two-phase student (ADAPT (distilled))",
    "weight-delta": "the variant's init + the base's two-phase delta (ADAPT (weight-delta))",
    "cross-patch": "the variant's blocks patched into the two-phase base student (cross-patch (2-phase))",
    "pretraining-delta": "the variant's init + the base's pre-training-only delta (F.1)",
    "sft-delta": "the variant's init + the base's SFT-only delta (F.1)",
}
ROUTED = ("distilled", "weight-delta")
TRAINING_SETTINGS = ("layers", "learning_rate", "pretraining_fraction", "batch_size")
MEASURING_SETTINGS = ("eval_problems", "validation_problems", "kl_examples")
ROUTING_POLICIES = ("average", "minimum")
ROUTING_THRESHOLDS = tuple(round(t, 2) for t in np.linspace(0, 1, 51))  # versions 1-3's calibration grid
# The variant's own student: ADAPT's loss (the trainer's default weights), or the same run with cross-entropy alone.
LOSS_WEIGHTS = {"distilled": {}, "ce-only": {"kl_weight": 0.0, "cosine_weight": 0.0}}
ADAPT_LARGE_SHAPE = {"num_hidden_layers": 8, "hidden_size": 128, "intermediate_size": 512}
ADAPT_SKILL_SHARES = {RETAINED: 0.35, TARGET: 0.3, HELD_OUT: 0.15, GRADED: 0.2}
ADAPT_POST_TRAINED = [RETAINED, TARGET, GRADED]


def adapt_family_config(seed: int, quick: bool = False, **overrides) -> LabConfig:
    """The ADAPT families: the lab's family with an 8-layer teacher whose pre-training and post-training include
    graded reversal (so every model has its own key: none is shared with the default families); `quick` uses the
    quick budgets."""
    values = {
        "seed": seed,
        "large_shape": ADAPT_LARGE_SHAPE,
        "skill_shares": ADAPT_SKILL_SHARES,
        "post_trained_skills": ADAPT_POST_TRAINED,
    } | overrides
    return LabConfig.quick_config(**values) if quick else LabConfig(**values)


@dataclass
class AdaptSettings:
    """What one family's ADAPT runs do; its hash keys the per-family records, so a changed setting reruns (trained
    students and measurements are kept by what determines them and reused)."""

    variants: list[str] = field(
        default_factory=lambda: ["large_instruct", "large_bracket"], metadata={"help": "Post-trained variants."}
    )
    layers: str = field(
        default="{every: 2, last: 1}", metadata={"help": "Teacher layers of the students (YAML layer selection)."}
    )
    orders: list[str] = field(default_factory=lambda: list(ORDERS), metadata={"help": "Patch orders."})
    budgets: list[int] = field(
        # 300 steps already give a student as accurate as its 8-layer teacher (nothing left to interpolate), so the
        # short budgets show the curve while the student still trails
        default_factory=lambda: [30, 100, 300, 1000],
        metadata={"help": "Interpolation stage: steps of each variant's direct two-phase distillation, one run each."},
    )
    steps: int = field(
        default=300,
        metadata={"help": "Steps of every distillation of the transfer and routing stages (in `budgets`: shared)."},
    )
    learning_rate: float = field(default=2e-3, metadata={"help": "Peak learning rate of every distillation."})
    pretraining_fraction: float = field(
        default=0.5, metadata={"help": "Share of the steps on the pre-training phase (ADAPT: 0.5)."}
    )
    batch_size: int = field(default=32, metadata={"help": "Rows per distillation step."})
    eval_problems: int = field(default=200, metadata={"help": "Test problems per scored skill (copy, reverse)."})
    validation_problems: int = field(
        default=200, metadata={"help": "Validation problems per scored skill: choose each size's patch order."}
    )
    kl_examples: int = field(
        default=256, metadata={"help": "Test-split examples in each variant's format for KL and cosine."}
    )
    routing_problems: int = field(
        default=60, metadata={"help": "Graded-reversal problems per length in each routing split (calibration, test)."}
    )
    routing_variant: str = field(default="large_instruct", metadata={"help": "Variant whose families are routed."})
    stages: list[str] = field(default_factory=lambda: list(STAGES), metadata={"help": "Stages to run, in order."})

    def __post_init__(self) -> None:
        from kinfolk.plugins.adapt.distillation import layer_selection

        layer_selection(self.layers)
        unknown = sorted(set(self.stages) - set(STAGES)) + sorted(set(self.orders) - set(ORDERS))
        unknown += sorted(set(self.variants) - {"large_instruct", "large_bracket"})
        if unknown:
            raise ValueError(
                f"unknown stages, orders or variants {unknown}: {STAGES}, {ORDERS}, large_instruct/bracket"
            )
        if "routing" in self.stages and self.routing_variant not in self.variants:
            raise ValueError(f"routing_variant {self.routing_variant!r} is not among the variants {self.variants}")


def format_of(variant: str) -> int:
    """The answer format a teacher is post-trained in (the base's SFT phase uses the preferred one)."""
    return BRACKET_FORMAT if variant == "large_bracket" else 0


def graded_problems(per_level: int, seed: int, split: str) -> Dataset:
    """`per_level` graded-reversal problems of each length (the first drawn of each), with their level."""
    skill = ALL_SKILLS[GRADED]
    lengths = range(GRADED_LENGTHS[0], GRADED_LENGTHS[1] + 1)
    drawn = corpus.eval_problems(GRADED, 4 * per_level * len(lengths), seed, split)
    kept = {length: [] for length in lengths}
    for row in drawn:
        rows = kept[skill.level(row["prompt"])]
        if len(rows) < per_level:
            rows.append(row)
    return Dataset.from_list([row for length in lengths for row in kept[length]])


def concordance(values: list[float]) -> float:
    """Share of pairs i < j (sizes in order) with values[j] > values[i], ties counting one half: (1 + Kendall's
    τ_a) / 2; 1 for a strictly rising curve, 0.5 for a flat one, 0 for a falling one.

    >>> concordance([0.1, 0.3, 0.2, 0.9]), concordance([0.5, 0.5, 0.5])
    (0.8333333333333334, 0.5)
    """
    pairs = [(a, b) for i, a in enumerate(values) for b in values[i + 1 :]]
    return float(np.mean([1.0 if b > a else 0.5 if b == a else 0.0 for a, b in pairs]))


def largest_drop(values: list[float]) -> float:
    """The largest fall from one size to the next (0 when the curve never falls)."""
    return float(max([0.0, *(a - b for a, b in itertools.pairwise(values))]))


class AdaptRunSettings:
    """What an ADAPT experiment's settings dataclass (adapt-controls, adapt-frontier) derives from its fields for
    its runs: a field-less base, so each version's plan keeps its own fields and their order.

    >>> AdaptRunSettings().distillation_seed(family=3, run=1)  # distinct for every family and run
    301
    """

    def distillation_seed(self, family: int, run: int) -> int:
        return 100 * family + run

    def adapt_settings(self) -> AdaptSettings:
        """The `AdaptFamily` settings of every run (one budget: `steps`; routing's fields where the version routes)."""
        routing = {
            name: getattr(self, name) for name in ("routing_problems", "routing_variant") if hasattr(self, name)
        }
        return AdaptSettings(
            variants=list(self.variants), layers=self.layers, orders=list(ORDERS), budgets=[self.steps],
            steps=self.steps, learning_rate=self.learning_rate, pretraining_fraction=self.pretraining_fraction,
            batch_size=self.batch_size, eval_problems=self.eval_problems,
            validation_problems=self.validation_problems, kl_examples=self.kl_examples, **routing,
        )  # fmt: skip


class TeacherDepthSettings:
    """What a settings dataclass with `teacher_layers`, `layers` and `family_overrides` fields (adapt-frontier,
    adapt-compute) derives from them: its ADAPT families with a `teacher_layers`-layer teacher, the teacher blocks of
    its student and each size's depth. Field-less, like `AdaptRunSettings`, so each plan keeps its own fields."""

    def family_config(self, seed: int) -> LabConfig:
        """The ADAPT family of `seed` with a `teacher_layers`-layer teacher (`family_overrides` last)."""
        shape = ADAPT_LARGE_SHAPE | {"num_hidden_layers": self.teacher_layers}
        return adapt_family_config(seed, **({"large_shape": shape} | self.family_overrides))

    def family(self, seed: int):
        """That family, built (or found in the lab's cache)."""
        from kinfolk.lab.world.family import build_family

        return build_family(self.family_config(seed), progress=False)

    def blocks(self) -> list[tuple[int, int]]:
        """The teacher blocks each student layer stands for (each a size patches in whole)."""
        from kinfolk.plugins.adapt.distillation import layer_selection

        teacher = self.family_config(0).large_shape["num_hidden_layers"]
        return [tuple(block) for block in layer_selection(self.layers).resolve(teacher).blocks]

    def depths(self) -> list[int]:
        """The depth of size k = 0..M patched front to back (in either order when the blocks are equal)."""
        blocks = self.blocks()
        return [len(blocks) + sum(end - start - 1 for start, end in blocks[:k]) for k in range(len(blocks) + 1)]
