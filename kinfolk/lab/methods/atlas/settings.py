"""The ATLAS lab experiment's settings, names and family: what every run of it is, before any runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kinfolk.compare.methods import METHODS as REGISTRY
from kinfolk.compare.methods import Method
from kinfolk.lab.world.family import LabConfig
from kinfolk.lab.world.skills import HELD_OUT, RETAINED, SEPARATED_TARGET, SKILLS, TARGET

BASELINE = "lora"
CONTROL = "norm-matched"  # full ATLAS's step-size control
# The lab's method names (its committed records are keyed by them) -> `kinfolk compare`'s method registry, which
# builds every lab adapter but CorDA (initialised from the retained data: the lab's alone, `build_adapter`).
REGISTRY_NAMES = {"lora": "lora", "atlas": "atlas", CONTROL: "norm_matched", "osf": "osf",
                  "lora+replay": "lora_replay", "lora+output-kl": "lora_output_kl"}  # fmt: skip
# The residual ablations: ATLAS's adapter with another residual (`kinfolk.plugins.atlas.config.RESIDUALS`).
ABLATIONS = {
    "plain": "plain",
    "centered": "centered",
    "distance-scaled": "distance_scaled",
    "pca-scaled": "pca_scaled",
}
METHODS = ("lora", "corda", "plain", "centered", "atlas", CONTROL, "lora+replay", "lora+output-kl")


def registry_method(name: str) -> Method:
    """The registry's method a lab method name builds (an ablation: ATLAS with the ablation's residual).

    >>> registry_method("norm-matched").residual, registry_method("plain").residual, registry_method("osf").adapter
    ('norm_matched', 'plain', 'osf')
    """
    if name in ABLATIONS:
        return dataclasses.replace(REGISTRY["atlas"], name=name, residual=ABLATIONS[name])
    return REGISTRY[REGISTRY_NAMES[name]]


# WeightedSFTConfig fields of the methods that add a loss term on the retained rows
REGULARISERS = {
    name: registry_method(name).regulariser for name in REGISTRY_NAMES if registry_method(name).regulariser
}
TARGETS = (TARGET, SEPARATED_TARGET)
SPLITS = ("validation", "test")
# The experiment's families: an 8-layer large base that learns both target skills in pre-training (every format).
FAMILY_SHARES = {RETAINED: 0.35, TARGET: 0.35, HELD_OUT: 0.1, SEPARATED_TARGET: 0.2}
GAIN_LEVELS = {"mid": 0.5, "plateau": 0.9}  # fixed target levels, as fractions of LoRA's test gain
AREA_RANGE = (0.1, 0.9)  # the comparison range, as fractions of LoRA's test gain
MIN_GAIN = 0.05  # below this LoRA gain (target score) a family has no levels
PLOT_GRID = tuple(round(0.05 * i, 2) for i in range(1, 25))  # fractions of LoRA's gain where fronts are tabulated


@dataclass
class AtlasSettings:
    """What one family's ATLAS runs do; its hash keys the per-family records, so a changed setting reruns."""

    targets: list[str] = field(
        default_factory=lambda: list(TARGETS), metadata={"help": "Target skills (reverse: overlapping, flip: apart)."}
    )
    methods: list[str] = field(default_factory=lambda: list(METHODS), metadata={"help": "Methods (lora first)."})
    # A first family at 3e-3..1e-1 and 200 steps: every method reached the plateau by step 50 and LoRA's front came
    # from the lowest rate, so the grid reaches lower and the runs are shorter with denser checkpoints.
    learning_rates: list[float] = field(
        default_factory=lambda: [1e-3, 3e-3, 1e-2, 3e-2], metadata={"help": "Learning-rate grid of every method."}
    )
    regularised_learning_rates: list[float] = field(
        default_factory=lambda: [3e-3, 3e-2],
        metadata={"help": "Learning rates of Replay and Output-KL (each at every strength): a sparser grid."},
    )
    replay_ratios: list[float] = field(
        default_factory=lambda: [0.1, 0.25, 0.5], metadata={"help": "Replay's shares of retained examples."}
    )
    output_kl_coefs: list[float] = field(
        default_factory=lambda: [0.3, 1.0, 3.0], metadata={"help": "Output-KL's strengths λ."}
    )
    steps: int = field(default=100, metadata={"help": "Optimiser steps of every run (cosine schedule)."})
    batch_size: int = field(default=16, metadata={"help": "Target examples per optimiser step."})
    checkpoint_every: int = field(default=10, metadata={"help": "Steps between measured checkpoints."})
    rank: int = field(default=4, metadata={"help": "Adapter rank (the width is 128)."})
    layer: int | None = field(
        default=None, metadata={"help": "Adapted decoder layer (default: mid depth, the paper's 17/36)."}
    )
    module: str = field(default="self_attn.o_proj", metadata={"help": "Adapted linear module of that layer."})
    regions: int = field(default=8, metadata={"help": "Atlas regions (k-means clusters)."})
    large_layers: int = field(default=8, metadata={"help": "Decoder layers of the families' large base."})
    target_examples: int = field(default=1024, metadata={"help": "Target training examples (train split)."})
    fit_examples: int = field(
        default=512, metadata={"help": "Retained train-split rows that fit the atlas and CorDA and feed Replay/KL."}
    )
    kl_contexts: int = field(default=128, metadata={"help": "Retained-KL contexts per split (validation, test)."})
    validation_problems: int = field(default=50, metadata={"help": "Validation problems per skill."})
    eval_problems: int = field(default=100, metadata={"help": "Test problems per skill."})

    def __post_init__(self) -> None:
        unknown = sorted(set(self.methods) - set(METHODS)) + sorted(set(self.targets) - set(SKILLS))
        if unknown:
            raise ValueError(f"unknown methods or skills {unknown}: methods {list(METHODS)}, skills {list(SKILLS)}")
        if BASELINE not in self.methods:
            raise ValueError(f"the methods must include the baseline {BASELINE!r}: every endpoint is paired with it")
        if RETAINED in self.targets:
            raise ValueError(f"{RETAINED!r} is the retained skill, not a target")

    def rates(self, method: str) -> list[float]:
        """The learning rates `method` runs at (Replay and Output-KL: the sparser grid)."""
        return list(self.regularised_learning_rates if method in REGULARISERS else self.learning_rates)

    def strengths(self, method: str) -> list[float | None]:
        option = REGULARISERS.get(method)
        return list(getattr(self, f"{option}s")) if option else [None]


def family_config(seed: int, settings: AtlasSettings, quick: bool = False) -> LabConfig:
    """The experiment's family: the lab's config with an 8-layer large base that also pre-trains on `flip` (and
    must answer it, in any format, as it must reversal)."""
    base = LabConfig.quick_config(seed=seed) if quick else LabConfig(seed=seed)
    thresholds = dict(base.thresholds)
    if not quick:
        thresholds["large_base"] = {**thresholds["large_base"], SEPARATED_TARGET: ("answer_accuracy", 0.8)}
    return dataclasses.replace(
        base,
        large_shape={**base.large_shape, "num_hidden_layers": settings.large_layers},
        skill_shares=dict(FAMILY_SHARES),
        thresholds=thresholds,
    )
