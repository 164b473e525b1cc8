"""`WeightedSFTConfig`: TRL's `SFTConfig` plus the options of example-weighted SFT (ATLANTIS).

Every `SFTConfig` option keeps its meaning, so the config parses with `TrlParser`, from the command line and from
YAML, exactly like `trl sft`'s; the weight options are more keys of the same flat namespace.

>>> import tempfile
>>> config = WeightedSFTConfig(
...     output_dir=tempfile.mkdtemp(), use_cpu=True, weight_reduction="sequence", prompt_loss_weight=0.1
... )
>>> config.weight_column, config.weight_reduction, config.prompt_loss_weight
('weight', 'sequence', 0.1)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import SFTConfig

WEIGHT_REDUCTIONS = ("token", "sequence", "self_normalized")


@dataclass
class WeightedSFTConfig(SFTConfig):
    r"""
    Configuration of [`WeightedSFTTrainer`]: every [`~trl.SFTConfig`] parameter, plus:

    Parameters that control the example weights:
        weight_column (`str` or `None`, *optional*, defaults to `"weight"`):
            Dataset column holding each example's non-negative weight. `None` trains every example with weight 1
            (useful with `prompt_loss_weight` alone).
        weight_reduction (`str`, *optional*, defaults to `"token"`):
            How per-token losses ℓ (with per-token weights W = example weight × prompt/completion weight) become the
            batch loss: `"token"` Σ W·ℓ / Σ token weights (SFTTrainer's loss when every weight is 1), `"sequence"`
            Σ W·ℓ / number of examples (the ATLANTIS paper's Algorithm 1), `"self_normalized"` Σ W·ℓ / Σ W.
        weight_clip_min (`float` or `None`, *optional*):
            Lower bound the weights are clipped to before training.
        weight_clip_max (`float` or `None`, *optional*):
            Upper bound the weights are clipped to before training.
        normalize_weights (`bool`, *optional*, defaults to `False`):
            Rescale the (clipped) weights so their mean over the dataset is 1.
        weight_eval_loss (`bool`, *optional*, defaults to `False`):
            Weight the evaluation loss by the eval dataset's weight column too.
        prompt_loss_weight (`float`, *optional*, defaults to `0.0`):
            Weight of the tokens SFTTrainer leaves out of the loss (the prompt under completion-only loss, the
            non-assistant turns under assistant-only loss): 0 is SFTTrainer's behaviour, 1 trains the full sequence.
    """

    weight_column: str | None = field(
        default="weight",
        metadata={
            "help": "Dataset column holding each example's non-negative weight. `None` trains every example with "
            "weight 1."
        },
    )
    weight_reduction: str = field(
        default="token",
        metadata={
            "help": "How weighted per-token losses become the batch loss: 'token' (Σ W·ℓ / Σ token weights; "
            "SFTTrainer's loss when every weight is 1), 'sequence' (Σ W·ℓ / number of examples, the ATLANTIS "
            "paper's Algorithm 1) or 'self_normalized' (Σ W·ℓ / Σ W).",
            "choices": list(WEIGHT_REDUCTIONS),
        },
    )
    weight_clip_min: float | None = field(
        default=None,
        metadata={"help": "Lower bound the example weights are clipped to before training (None: no bound)."},
    )
    weight_clip_max: float | None = field(
        default=None,
        metadata={"help": "Upper bound the example weights are clipped to before training (None: no bound)."},
    )
    normalize_weights: bool = field(
        default=False,
        metadata={"help": "Rescale the (clipped) weights so that their mean over the dataset is 1."},
    )
    weight_eval_loss: bool = field(
        default=False,
        metadata={
            "help": "Weight the evaluation loss by the eval dataset's weight column too; otherwise eval examples "
            "count with weight 1 (the prompt loss weight still applies)."
        },
    )
    prompt_loss_weight: float = field(
        default=0.0,
        metadata={
            "help": "Loss weight of the tokens SFTTrainer would leave out of the loss (the prompt under "
            "completion-only loss, the non-assistant turns under assistant-only loss); it multiplies the example "
            "weight. 0 reproduces SFTTrainer, 1 trains on the full sequence, values in between down-weight the prompt."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.weight_reduction not in WEIGHT_REDUCTIONS:
            raise ValueError(
                f"weight_reduction={self.weight_reduction!r} is not one of {', '.join(map(repr, WEIGHT_REDUCTIONS))}"
            )
        if not 0.0 <= self.prompt_loss_weight <= 1.0:
            raise ValueError(f"prompt_loss_weight={self.prompt_loss_weight} must lie in [0, 1]")
        for name in ("weight_clip_min", "weight_clip_max"):
            bound = getattr(self, name)
            if bound is not None and not bound >= 0:
                raise ValueError(f"{name}={bound} must be a non-negative number (weights are non-negative)")
        if (
            self.weight_clip_min is not None
            and self.weight_clip_max is not None
            and self.weight_clip_min > self.weight_clip_max
        ):
            raise ValueError(
                f"weight_clip_min={self.weight_clip_min} is larger than weight_clip_max={self.weight_clip_max}"
            )
