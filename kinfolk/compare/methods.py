"""The methods a comparison trains, by name: what each builds, the settings that shape its runs and its help line.
`kinfolk compare` (its `--methods`, its runs' fingerprints and training) and the lab's ATLAS experiments (their
adapters) read this one table, so a new method is one entry here, its test and its line in docs/compare.md.

Every adapter sits where ATLAS would and has its rank (`AtlasConfig`'s placement: by default the attention output
projection of one decoder layer at 0.47 of the depth), so a comparison changes the method and nothing else:

- `adapter` is what is trained: "lora", "atlas" (with the method's ATLAS `residual`), "osf" (PEFT's orthogonal
  subspace fine-tuning, as many trained singular directions as the rank) or "full" (every weight, no adapter);
- `regulariser` names the `WeightedSFTConfig` field (and `kinfolk compare` option) of the loss term it adds on the
  retained training rows, None when it adds none;
- `settings` are the `CompareArguments` fields, beyond those every run shares, that shape its runs (its
  `run.json` fingerprint).

>>> from kinfolk.plugins.atlas import AtlasConfig
>>> from kinfolk.testing import build_model
>>> model, placement = build_model("qwen3", "large"), AtlasConfig(r=4, layers_to_transform=[1])
>>> [type(METHODS[name].peft_config(model, placement)).__name__ for name in METHODS]
['LoraConfig', 'AtlasConfig', 'AtlasConfig', 'LoraConfig', 'LoraConfig', 'OSFConfig', 'NoneType']
>>> METHODS["norm_matched"].peft_config(model, placement).residual, METHODS["lora_replay"].regulariser
('norm_matched', 'replay_ratio')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

ADAPTERS = ("lora", "atlas", "osf", "full")
PLACEMENT = ("rank", "target_modules", "layers")  # the shared placement's options
ATLAS_FIT = ("retained_train_split", "atlas_regions", "atlas_directions", "atlas_fit_rows")


@dataclass(frozen=True)
class Method:
    """One method of the registry (see the module)."""

    name: str
    help: str
    adapter: str  # one of ADAPTERS
    settings: tuple[str, ...]
    residual: str | None = None  # the ATLAS residual, for adapter "atlas"
    regulariser: str | None = None  # "output_kl_coef" or "replay_ratio"

    def __post_init__(self) -> None:
        if self.adapter not in ADAPTERS or (self.adapter == "atlas") != (self.residual is not None):
            raise ValueError(f"method {self.name}: adapter {self.adapter!r} with residual {self.residual!r}")

    @property
    def fits_atlas(self) -> bool:
        """Whether its adapter's atlas is fitted (or loaded) from the retained training rows before training."""
        return self.adapter == "atlas"

    def peft_config(self, model: Any, placement: Any) -> Any:
        """The PEFT config of its adapter on `model` at `placement`'s modules and rank (an `AtlasConfig`); None for
        full fine-tuning. The model is read (its shapes, its default placement), not changed."""
        if self.adapter == "full":
            return None
        if self.adapter == "atlas":
            return dataclasses.replace(placement, residual=self.residual)
        from kinfolk.plugins.atlas_comparators import matching_lora_config, matching_osf_config

        if self.adapter == "osf":
            return matching_osf_config(model, placement)
        return matching_lora_config(model, placement)


def _methods(*methods: Method) -> dict[str, Method]:
    return {method.name: method for method in methods}


METHODS = _methods(
    Method(
        "lora",
        "LoRA at ATLAS's placement and rank (the attention output projection of one layer at 0.47 of the depth, "
        "unless --target_modules/--layers say otherwise), so the comparison changes the method and nothing else",
        "lora",
        PLACEMENT,
    ),
    Method("atlas", "ATLAS, its atlas fitted on the retained training rows", "atlas", PLACEMENT + ATLAS_FIT, "atlas"),
    Method(
        "norm_matched",
        "ATLAS's step-size control: the plain residual rescaled token by token to the norm of ATLAS's update (its "
        "atlas fitted as ATLAS's)",
        "atlas",
        PLACEMENT + ATLAS_FIT,
        "norm_matched",
    ),
    Method(
        "lora_output_kl",
        "LoRA plus Output-KL (--output_kl_coef) on the retained training rows",
        "lora",
        (*PLACEMENT, "retained_train_split", "output_kl_coef"),
        regulariser="output_kl_coef",
    ),
    Method(
        "lora_replay",
        "LoRA plus replay (--replay_ratio) of the retained training rows",
        "lora",
        (*PLACEMENT, "retained_train_split", "replay_ratio"),
        regulariser="replay_ratio",
    ),
    Method(
        "osf",
        "OSF (PEFT's orthogonal subspace fine-tuning) training as many of the weight's smallest singular directions "
        "as the rank, at the same placement",
        "osf",
        PLACEMENT,
    ),
    Method(
        "full",
        "full fine-tuning of every weight (refused where weights, gradients and Adam's moments do not fit)",
        "full",
        (),
    ),
)
