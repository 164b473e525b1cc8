"""`LayerDistillationConfig`: the SFT config plus the ADAPT / boomerang distillation loss and the papers' defaults.

Loss per trained token: CE + kl_weight · T² · KL(teacher ‖ student) + cosine_weight · Σ_i (1 − cos(h_i, g_i)),
where h_i is student layer i's output and g_i the output of the last teacher layer of its block (layer map).
Defaults follow the papers: kl_weight 0.1, cosine_weight 10 / (M + 1) (ADAPT; boomerang used 2.0), lr 3e-4,
AdamW β = (0.9, 0.95), weight decay 0.1, cosine schedule, and with two phases half the steps on each (ADAPT §3.2).
Loads from YAML with `TrlParser` like any TRL config.

>>> config = LayerDistillationConfig(output_dir="out", use_cpu=True, bf16=False)
>>> config.kl_weight, config.learning_rate, config.adam_beta2, config.lr_scheduler_type.value
(0.1, 0.0003, 0.95, 'cosine')
>>> config.pretraining_fraction
0.5
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from trl import SFTConfig

from kinfolk.trainers.config_defaults import apply_config_defaults


@dataclass
class LayerDistillationConfig(SFTConfig):
    r"""
    Configuration for [`LayerDistillationTrainer`]: every [`~trl.SFTConfig`] field, plus the distillation loss.

    Parameters:
        teacher_model_init_kwargs (`dict`, *optional*):
            Keyword arguments for `AutoModelForCausalLM.from_pretrained` when the teacher is given as a path.
        layer_map (`str`, *optional*):
            Layer map JSON (student layer i <- teacher block [a, b)); defaults to the student directory's
            `adapt_layer_map.json` written by `kinfolk merge init-student`.
        kl_weight (`float`, defaults to `0.1`):
            λ_KL, weight of the T²-scaled KL(teacher ‖ student) between next-token distributions.
        cosine_weight (`float`, *optional*):
            λ_cos, weight of the summed per-layer cosine distance; defaults to 10 / (M + 1) for M student layers.
            With `kl_weight` 0 too, the teacher is not run: plain cross-entropy on the two phases.
        temperature (`float`, defaults to `1.0`):
            Softmax temperature T of both distributions in the KL term.
        pretraining_fraction (`float`, defaults to `0.5`):
            With a `pretraining_dataset`: the share of the `max_steps` optimiser steps spent on it (phase 1, every
            token trained) before the SFT data (phase 2, responses only), under one learning-rate schedule.
    """

    # Defaults that differ from SFTConfig: the ADAPT / boomerang distillation recipe.
    learning_rate: float = field(default=3e-4, metadata={"help": "Initial learning rate (ADAPT: 3e-4)."})
    adam_beta2: float = field(default=0.95, metadata={"help": "AdamW β2 (ADAPT: 0.95)."})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay (ADAPT: 0.1)."})
    lr_scheduler_type: str = field(
        default="cosine",
        metadata={"help": "Scheduler over both phases together: one continuous schedule (ADAPT: cosine)."},
    )

    teacher_model_init_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments for `AutoModelForCausalLM.from_pretrained` of a teacher given by path."},
    )
    layer_map: str | None = field(
        default=None,
        metadata={"help": "Layer map JSON; defaults to the student directory's adapt_layer_map.json."},
    )
    kl_weight: float = field(default=0.1, metadata={"help": "λ_KL: weight of T²·KL(teacher ‖ student)."})
    cosine_weight: float | None = field(
        default=None,
        metadata={"help": "λ_cos: weight of Σ_i (1 − cos) over student layers; None = 10 / (M + 1)."},
    )
    temperature: float = field(default=1.0, metadata={"help": "Softmax temperature T of the KL term."})
    pretraining_fraction: float = field(
        default=0.5,
        metadata={
            "help": "Share of the max_steps optimiser steps spent on the pre-training phase when there is one "
            "(ADAPT: 0.5); the rest go to the SFT phase, under one learning-rate schedule."
        },
    )

    _VALID_DICT_FIELDS: ClassVar[list[str]] = [*SFTConfig._VALID_DICT_FIELDS, "teacher_model_init_kwargs"]

    def __post_init__(self):
        apply_config_defaults(self)  # before TRL's, which would default bf16 to True
        super().__post_init__()
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if self.kl_weight < 0 or (self.cosine_weight is not None and self.cosine_weight < 0):
            raise ValueError(f"loss weights must be non-negative (kl_weight {self.kl_weight}, "
                             f"cosine_weight {self.cosine_weight})")  # fmt: skip
        if not 0 <= self.pretraining_fraction <= 1:
            raise ValueError(f"pretraining_fraction must be in [0, 1], got {self.pretraining_fraction}")
        if self.label_smoothing_factor:
            raise ValueError(
                "label_smoothing_factor is not supported by LayerDistillationTrainer (the KL term softens)"
            )
