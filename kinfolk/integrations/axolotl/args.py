"""The `kinfolk:` block of an axolotl YAML: pydantic models that axolotl merges into its own config schema.

Every option is one that `kinfolk sft` takes under the same name (`WeightedSFTConfig`'s weight options, `--atlas_*`,
the measuring callbacks' arguments), so a run moves between the two without renaming; docs/axolotl.md lists them.

>>> options = KinfolkOptions(weight_column="w", retained_dataset="retained.jsonl", retained_kl={"every_n_steps": 5})
>>> options.weight_reduction, options.retained_kl.every_n_steps, options.retained_kl.cache
('token', 5, 'auto')
>>> KinfolkOptions(weight_reduction="mean")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for KinfolkOptions
weight_reduction
  Value error, kinfolk.weight_reduction='mean' is not one of 'token', 'sequence', 'self_normalized' ...
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from kinfolk.divergence import CACHES, DIVERGENCES
from kinfolk.plugins.atlas.config import ATLAS_DTYPES, RESIDUALS
from kinfolk.trainers.weighted_sft_config import WEIGHT_REDUCTIONS


def _one_of(name: str, value: str, allowed) -> str:
    if value not in allowed:
        raise ValueError(f"kinfolk.{name}={value!r} is not one of {', '.join(map(repr, allowed))}")
    return value


def _choices(prefix: str, table: dict[str, tuple[str, ...]]):
    """A validator of the fields `table` names: each value must be one of its field's choices."""

    def check(cls, value: str, info: ValidationInfo) -> str:
        return _one_of(prefix + info.field_name, value, table[info.field_name])

    return field_validator(*table)(classmethod(check))


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt key is refused, not ignored


class AtlasOptions(_Block):
    """`kinfolk.atlas`: the ATLAS tuner of `adapter: atlas` (`kinfolk sft`'s `--atlas_*` options)."""

    r: int = Field(default=16, ge=1, description="Rank of the residual.")
    layers: list[int] | None = Field(default=None, description="Decoder layers to adapt (default: 17/36 of depth).")
    target_modules: list[str] | None = Field(default=None, description="Modules to adapt (default: o_proj).")
    residual: str = Field(default="atlas", description="Residual variant (Table 14 of the paper).")
    regions: int = Field(default=16, ge=1, description="Atlas regions K (1 = Global PCA).")
    directions: int = Field(default=8, ge=1, description="PCA directions p per region.")
    routing_temperature: float = Field(default=1.0, gt=0, description="Soft-routing temperature multiple.")
    dtype: str = Field(default="float32", description="Atlas storage dtype.")
    samples: int | None = Field(default=None, ge=1, description="Fit on the first N retained rows.")
    mask_prompt: bool = Field(default=False, description="Fit on completion tokens only.")
    fit_batch_size: int = Field(default=8, ge=1, description="Batch size of the fitting passes.")
    fit_max_length: int = Field(default=1024, ge=1, description="Retained rows are cut to this many tokens.")
    seed: int = Field(default=0, description="Seed of the atlas k-means.")

    _check_choices = _choices("atlas.", {"residual": RESIDUALS, "dtype": tuple(ATLAS_DTYPES)})


class RetainedKLOptions(_Block):
    """`kinfolk.retained_kl`: `RetainedKLCallback` on `kinfolk.retained_dataset`."""

    every_n_steps: int | None = Field(default=None, ge=1, description="Also measure every N optimiser steps.")
    cache: str = Field(default="auto", description="Frozen side: auto, expectation, hidden, log_probs or none.")
    cache_top_k: int | None = Field(default=None, ge=1, description="With cache: log_probs, keep the top k.")
    divergence: str = Field(default="forward_kl", description="forward_kl, reverse_kl or jsd.")
    positions: str = Field(default="response", description="response (trained tokens) or all.")
    batch_size: int = Field(default=8, ge=1)
    max_length: int | None = Field(default=None, ge=1, description="Default: axolotl's sequence_len.")
    samples: int | None = Field(default=None, ge=1, description="Measure on the first N retained rows.")
    measure_at_start: bool = Field(default=True, description="Measure before the first step (0 for an adapter).")

    _check_choices = _choices(
        "retained_kl.", {"cache": CACHES, "divergence": DIVERGENCES, "positions": ("response", "all")}
    )


class TargetOptions(_Block):
    """`kinfolk.target`: `TargetMetricCallback` with minus the validation NLL of held-out rows."""

    dataset: str = Field(description="Held-out target rows (a data file, data folder or save_to_disk folder).")
    split: str = Field(default="train")
    every_n_steps: int | None = Field(default=None, ge=1)
    batch_size: int = Field(default=8, ge=1)
    max_length: int | None = Field(default=None, ge=1, description="Default: axolotl's sequence_len.")
    metric_name: str = Field(default="target")


class KinfolkOptions(_Block):
    """`kinfolk:`: ATLANTIS weights, the ATLAS adapter's data and the drift measurements of one axolotl run."""

    weight_column: str | None = Field(default=None, description="Dataset column of each example's weight.")
    weight_reduction: str = Field(default="token", description="token, sequence or self_normalized.")
    weight_clip_min: float | None = Field(default=None, ge=0)
    weight_clip_max: float | None = Field(default=None, ge=0)
    normalize_weights: bool = Field(default=False, description="Rescale the weights to mean 1 over the rows.")
    prompt_loss_weight: float = Field(default=0.0, ge=0, le=1, description="Weight of untrained (prompt) tokens.")
    retained_dataset: str | None = Field(default=None, description="Retained rows: atlas fit and retained KL.")
    retained_split: str = Field(default="train")
    atlas: AtlasOptions = Field(default_factory=AtlasOptions)
    retained_kl: RetainedKLOptions | None = None
    target: TargetOptions | None = None

    _check_choices = _choices("", {"weight_reduction": WEIGHT_REDUCTIONS})

    @model_validator(mode="after")
    def _consistent(self) -> KinfolkOptions:
        low, high = self.weight_clip_min, self.weight_clip_max
        if low is not None and high is not None and low > high:
            raise ValueError(f"kinfolk.weight_clip_min={low} is larger than kinfolk.weight_clip_max={high}")
        if self.retained_kl is not None and self.retained_dataset is None:
            raise ValueError("kinfolk.retained_kl measures on kinfolk.retained_dataset, which is not set")
        return self

    @property
    def weighted(self) -> bool:
        """Whether the loss is kinfolk's weighted one (a weight column, or prompt tokens with a weight)."""
        return self.weight_column is not None or self.prompt_loss_weight > 0


class KinfolkArgs(BaseModel):
    """What the plugin adds to axolotl's config: the `kinfolk:` block (absent: the plugin changes nothing)."""

    kinfolk: KinfolkOptions | None = Field(default=None, description="kinfolk's options (docs/axolotl.md).")
