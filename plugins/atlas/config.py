"""`AtlasConfig`: the PEFT config of an ATLAS adapter (fields parse with `HfArgumentParser`/`TrlParser` like
`LoraConfig`'s).

>>> from kinfolk.plugins.atlas import AtlasConfig
>>> config = AtlasConfig(layers_to_transform=[17], r=16, residual="atlas")
>>> config.peft_type.value, config.num_regions, config.num_directions
('ATLAS', 16, 8)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from peft.config import PeftConfig

from kinfolk.errors import AdapterConfigError
from kinfolk.peft_types import extend_peft_type
from kinfolk.plugins.atlas.base_check import MISMATCH_POLICIES
from kinfolk.plugins.atlas.saved import check_saved_adapter

# Residual variants in the order of the paper's Table 14, then the full method, then the step-size control (the
# plain residual at the full method's per-token norm); see layer.py for the equations.
RESIDUALS = (
    "plain",
    "centered",
    "distance_scaled",
    "pca_scaled",
    "input_filter",
    "output_filter",
    "atlas",
    "norm_matched",
)
ATLAS_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# The paper adapts layer 17 of Qwen3-8B's 36 (zero-based): 47% of the way through the decoder.
DEFAULT_RELATIVE_DEPTH = 17 / 36


@dataclass
class AtlasConfig(PeftConfig):
    """Configuration of an ATLAS adapter: a shared rank-`r` residual `B·tanh(A·…)` conditioned per token by an atlas
    of the frozen model's activations on retained data (`fit_atlas` fills the atlas; see `layer.py`).

    With `target_modules=None` the adapter goes on the attention output projection; with `layers_to_transform=None`
    too, on the one decoder layer at 47% depth (the paper's layer 17 of 36). An unfitted atlas is degenerate (one
    centre at the origin, no directions): every variant then reduces to `B·tanh(A·h)` (distance scaling aside), so
    the adapter works, and trains, before or without `fit_atlas`.
    """

    r: int = field(default=16, metadata={"help": "Rank of the shared residual: A is r × in_features, B out × r."})
    residual: Literal[RESIDUALS] = field(
        default="atlas",
        metadata={
            "help": "Residual variant (paper Table 14): plain, centered, distance_scaled, pca_scaled, input_filter, "
            "output_filter, or atlas (both filters with PCA scaling); norm_matched is the step-size control (the "
            "plain residual rescaled per token to the atlas residual's norm)."
        },
    )
    num_regions: int = field(
        default=16, metadata={"help": "K, the atlas regions fitted by k-means; 1 is the paper's Global-PCA variant."}
    )
    num_directions: int = field(
        default=8, metadata={"help": "p, the top PCA directions stored per region (capped at the module's widths)."}
    )
    routing_temperature: float = field(
        default=1.0,
        metadata={
            "help": "Soft-routing temperature as a multiple of the fitted scale (the median gap between a token's "
            "nearest and second-nearest region); smaller routes harder."
        },
    )
    atlas_dtype: Literal[tuple(ATLAS_DTYPES)] = field(
        default="float32",
        metadata={
            "help": "Storage dtype of the atlas buffers, kept whatever the base model's dtype; the residual is "
            "computed in float32. bfloat16 halves the file."
        },
    )
    target_modules: list[str] | str | None = field(
        default=None,
        metadata={
            "help": "Module names or a regex to adapt (nn.Linear only). Default: the attention output projection "
            "(`self_attn.o_proj`) of the supported decoder architectures."
        },
    )
    exclude_modules: list[str] | str | None = field(
        default=None, metadata={"help": "Module names or a regex to exclude from adaptation."}
    )
    layers_to_transform: list[int] | int | None = field(
        default=None,
        metadata={
            "help": "Decoder-layer indices to adapt. Default with the default target: the one layer at 17/36 of the depth."
        },
    )
    layers_pattern: list[str] | str | None = field(
        default=None, metadata={"help": "Name of the layer list when `layers_to_transform` is used (e.g. 'layers')."}
    )
    init_weights: bool = field(
        default=True,
        metadata={
            "help": "True: B = 0, so a fresh adapter leaves the model's output unchanged. False: random B and a random "
            "atlas (for tests)."
        },
    )
    modules_to_save: list[str] | None = field(
        default=None, metadata={"help": "Modules besides the adapter layers to train and save."}
    )
    base_fingerprints: dict[str, str] | None = field(
        default=None,
        metadata={
            "help": "Filled in, not set: per adapted module, a hash of the base weight the adapter was made on "
            "(`kinfolk.plugins.atlas.base_check`); loading onto other weights warns or refuses (base_mismatch)."
        },
    )
    base_mismatch: Literal["warn", "error"] = field(
        default="warn",
        metadata={
            "help": "Loading onto a base whose adapted weights differ from the recorded ones: 'warn' (one line) or "
            "'error' (AdapterBaseMismatchError). KINFOLK_ATLAS_BASE_MISMATCH overrides it."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        self.peft_type = extend_peft_type("ATLAS")
        self.target_modules = (
            set(self.target_modules) if isinstance(self.target_modules, list) else self.target_modules
        )
        self.exclude_modules = (
            set(self.exclude_modules) if isinstance(self.exclude_modules, list) else self.exclude_modules
        )
        if isinstance(self.target_modules, str) and self.layers_to_transform is not None:
            raise AdapterConfigError("`layers_to_transform` cannot be used when `target_modules` is a regex string")
        if self.residual not in RESIDUALS:
            raise AdapterConfigError(
                f"residual={self.residual!r} is not an ATLAS variant; choose one of {', '.join(RESIDUALS)}"
            )
        if self.atlas_dtype not in ATLAS_DTYPES:
            raise AdapterConfigError(f"atlas_dtype={self.atlas_dtype!r}; choose one of {', '.join(ATLAS_DTYPES)}")
        for name in ("r", "num_regions", "num_directions"):
            if int(getattr(self, name)) < 1:
                raise AdapterConfigError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.base_mismatch not in MISMATCH_POLICIES:
            raise AdapterConfigError(
                f"base_mismatch={self.base_mismatch!r}; choose one of {', '.join(MISMATCH_POLICIES)}"
            )
        if not self.routing_temperature > 0:
            raise AdapterConfigError(f"routing_temperature must be > 0, got {self.routing_temperature!r}")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, subfolder: str | None = None, **kwargs):
        """PEFT's loader, plus a check of a local adapter's weights against this config (`saved.py`): an edited
        `r` / `num_regions` / `num_directions` or a truncated file is named before PEFT builds anything."""
        config = super().from_pretrained(pretrained_model_name_or_path, subfolder=subfolder, **kwargs)
        directory = Path(pretrained_model_name_or_path) / (subfolder or "")
        if isinstance(config, AtlasConfig) and directory.is_dir():
            check_saved_adapter(directory, config.r, config.num_regions, config.num_directions)
        return config

    @property
    def torch_atlas_dtype(self) -> torch.dtype:
        return ATLAS_DTYPES[self.atlas_dtype]

    def save_pretrained(self, save_directory: str, **kwargs) -> None:
        """PEFT's `adapter_config.json`, then the model card's kinfolk section (PEFT has written its card by now)."""
        super().save_pretrained(save_directory, **kwargs)
        from kinfolk.plugins.atlas.model_card import write_atlas_card

        write_atlas_card(save_directory)
