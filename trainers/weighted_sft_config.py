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

from kinfolk.divergence import DIVERGENCES
from kinfolk.trainers.config_defaults import apply_config_defaults

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

    Parameters of the regularisers against forgetting (see `kinfolk.trainers.regularisers`):
        retained_dataset_name (`str` or `None`, *optional*):
            Retained data (a Hub dataset, a data folder or a `save_to_disk` folder) for replay and Output-KL; the
            trainer's `retained_dataset` argument takes precedence.
        retained_dataset_split (`str`, *optional*, defaults to `"train"`):
            Split of `retained_dataset_name` to use.
        replay_ratio (`float`, *optional*, defaults to `0.0`):
            Fraction of the training examples drawn from the retained data (Replay).
        replay_weight (`float`, *optional*, defaults to `1.0`):
            Example weight of the replayed examples.
        output_kl_coef (`float`, *optional*, defaults to `0.0`):
            λ of the Output-KL term λ·KL(frozen‖current) on retained batches (PEFT models: frozen = adapters off).
        output_kl_divergence (`str`, *optional*, defaults to `"forward_kl"`):
            Divergence of the Output-KL term: `"forward_kl"` KL(frozen‖current), `"reverse_kl"` or `"jsd"`.
        output_kl_batch_size (`int` or `None`, *optional*):
            Retained examples per micro-batch for Output-KL (default: `per_device_train_batch_size`).
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

    retained_dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Retained data for replay and Output-KL: a Hub dataset, a data folder or a `save_to_disk` folder "
            "(the trainer's `retained_dataset` argument takes precedence)."
        },
    )
    retained_dataset_split: str = field(default="train", metadata={"help": "Split of `retained_dataset_name` to use."})
    replay_ratio: float = field(
        default=0.0,
        metadata={
            "help": "Replay: fraction of the training examples drawn from the retained data (0 = no replay; "
            "0.25 = one retained example for every three training examples)."
        },
    )
    replay_weight: float = field(default=1.0, metadata={"help": "Example weight of the replayed retained examples."})
    output_kl_coef: float = field(
        default=0.0,
        metadata={
            "help": "Output-KL: λ of the term λ·KL(frozen‖current) on a retained batch per micro-batch, the frozen "
            "distribution being the PEFT model with its adapters disabled (0 = off)."
        },
    )
    output_kl_divergence: str = field(
        default="forward_kl",
        metadata={
            "help": "Divergence of the Output-KL term: 'forward_kl' KL(frozen‖current), 'reverse_kl' or 'jsd'.",
            "choices": list(DIVERGENCES),
        },
    )
    output_kl_batch_size: int | None = field(
        default=None,
        metadata={"help": "Retained examples per micro-batch for Output-KL (default: per_device_train_batch_size)."},
    )

    def __post_init__(self):
        apply_config_defaults(self)  # before TRL's, which would default bf16 to True
        super().__post_init__()
        # A command line cannot spell None: `--weight_column None` arrives as the string "None".
        if self.weight_column in ("None", "none", ""):
            self.weight_column = None
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
        if not 0.0 <= self.replay_ratio < 1.0:
            raise ValueError(f"replay_ratio={self.replay_ratio} must lie in [0, 1)")
        for name in ("replay_weight", "output_kl_coef"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be non-negative")
        if self.output_kl_batch_size is not None and self.output_kl_batch_size < 1:
            raise ValueError(f"output_kl_batch_size={self.output_kl_batch_size} must be at least 1")
        if (
            self.weight_clip_min is not None
            and self.weight_clip_max is not None
            and self.weight_clip_min > self.weight_clip_max
        ):
            raise ValueError(
                f"weight_clip_min={self.weight_clip_min} is larger than weight_clip_max={self.weight_clip_max}"
            )
