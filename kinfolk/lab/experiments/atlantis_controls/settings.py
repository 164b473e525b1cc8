"""What the atlantis-controls plan fixes before its runs: the arms, their grids, the pools and the weak large base.

Every arm trains the large base (the model that also supplies a = log p_bL(y|x)) for the same steps on the same
pool; they differ only in the per-row weights, or, for the verifier filter, in which rows are kept:

| arm | weights | grid (chosen on validation) |
|---|---|---|
| `uniform` | 1 on every row | learning rate |
| `ratio`, `algorithm1` | the formula, per byte, the library's clipping and self-normalisation | temperature |
| `a-only` | a per byte alone, the same transforms | temperature |
| `filter` | 1 on the rows whose a per byte ranks in the top fraction, the rest dropped | fraction |
| `oracle` | the cell's estimand p*/q | none |

>>> settings = ControlsSettings()
>>> [cell.name for cell in settings.cells()]
['strong/pr', 'strong/pd-both', 'weak/pr', 'strong/pd-off_format']
>>> weak = settings.family_config(3, "weak")
>>> weak.large_pretrain_until["at_least"], weak.thresholds["large_base"][TARGET]
(0.6, ('answer_accuracy', 0.5))
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kinfolk.lab.protocol.settings import FamilySettings
from kinfolk.lab.world.family import LabConfig
from kinfolk.lab.world.skills import TARGET

BASES = ("strong", "weak")
WEAKENED_MODELS = ("large_base", "large_instruct", "large_bracket")  # the weak base and its post-trained variants


def weak_base_config(config: LabConfig) -> LabConfig:
    """`config` with a large base stopped as soon as it answers 60 % of validation reversals (checked every 25
    steps) instead of 95 %: the same run as the strong base's, cut early, so `a` is not an answer key. Its target
    thresholds ask for that skill level (0.5), not the strong base's."""
    thresholds = {name: dict(per_skill) for name, per_skill in config.thresholds.items()}
    for name in WEAKENED_MODELS:
        if TARGET in thresholds.get(name, {}):
            thresholds[name][TARGET] = (thresholds[name][TARGET][0], 0.5)
    until = {"skill": TARGET, "metric": "answer_accuracy", "at_least": 0.6, "every": 25}
    return dataclasses.replace(config, large_pretrain_until=until, thresholds=thresholds)


@dataclass(frozen=True)
class Cell:
    """One trained pool: the large base that scores a and is trained (`base`), the pool and the arms run on it."""

    base: str
    pool: str
    arms: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.base}/{self.pool}"


@dataclass(frozen=True)
class ControlsSettings(FamilySettings):
    pool_size: int = field(default=1536, metadata={"help": "Rows drawn into each pool (copy and reverse)."})
    steps: int = field(default=150, metadata={"help": "SFT steps of every arm."})
    learning_rate: float = field(default=1e-3, metadata={"help": "Learning rate of every weighted arm."})
    learning_rates: list[float] = field(
        default_factory=lambda: [3e-4, 1e-3, 3e-3],
        metadata={"help": "Uniform SFT's grid: it gets a tuned knob, as the formulas get their temperature."},
    )
    temperatures: list[float] = field(
        default_factory=lambda: [0.25, 0.5, 1.0, 2.0],
        metadata={"help": "Temperature grid of the formulas and of a-only (0.25: version 2 chose its edge, 0.5)."},
    )
    filter_fractions: list[float] = field(
        default_factory=lambda: [0.125, 0.25, 0.5, 0.75],
        metadata={"help": "Shares of the pool the verifier filter keeps (top by a per byte)."},
    )
    strong_arms: list[str] = field(
        default_factory=lambda: ["uniform", "ratio", "a-only", "filter", "oracle"],
        metadata={"help": "Arms on the pools `pr` and `pd-both` under the strong and the weak large base."},
    )
    off_format_arms: list[str] = field(
        default_factory=lambda: ["uniform", "ratio", "algorithm1"],
        metadata={"help": "Arms on `pd-off_format` (40 % ideal, 60 % off-format): the README's format advice."},
    )
    eval_problems: int = field(default=200, metadata={"help": "Test problems per skill (copy, reverse)."})
    validation_problems: int = field(default=200, metadata={"help": "Validation problems per skill."})
    work: str = field(
        default="runs/atlantis-controls", metadata={"help": "Where each scored pool and arm's result is kept."}
    )
    records: str = field(
        default="docs/results/atlantis-controls-families", metadata={"help": "Where each run's record is committed."}
    )
    family_overrides: dict = field(
        default_factory=dict, metadata={"help": "LabConfig fields over the default family (the tests' micro family)."}
    )

    def cells(self) -> list[Cell]:
        arms = tuple(self.strong_arms)
        return [
            Cell("strong", "pr", arms),
            Cell("strong", "pd-both", arms),
            Cell("weak", "pr", arms),
            Cell("strong", "pd-off_format", tuple(self.off_format_arms)),
        ]

    def grid(self, arm: str) -> list[float]:
        """The values an arm is trained at (one run per value); the oracle has none (one run)."""
        if arm == "uniform":
            return list(self.learning_rates)
        if arm == "filter":
            return list(self.filter_fractions)
        if arm == "oracle":
            return [1.0]
        return list(self.temperatures)

    def family_config(self, seed: int, base: str) -> LabConfig:
        config = LabConfig(seed=seed, **self.family_overrides)
        return config if base == "strong" else weak_base_config(config)
