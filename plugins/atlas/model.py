"""`AtlasModel`: the PEFT tuner that puts `AtlasLinear` layers into a model.

Beyond `BaseTuner` it resolves the default placement (the attention output projection of one layer at 47% depth,
through `kinfolk.layout`), keeps the atlas at its own dtype when PEFT up-casts adapters, records each adapted
module's base weight and checks it when an adapter is loaded (`base_check`: the same width, other weights), and
turns a checkpoint made for a base of another width into an error that says so.

>>> import torch
>>> from peft import get_peft_model
>>> from kinfolk.plugins.atlas import AtlasConfig
>>> from kinfolk.testing import build_model
>>> model = get_peft_model(build_model("qwen3", "large"), AtlasConfig(r=4))
>>> model.base_model.targeted_module_names
['model.layers.2.self_attn.o_proj']
"""

from __future__ import annotations

from typing import ClassVar

from peft.tuners.tuners_utils import BaseTuner, BaseTunerLayer
from torch import nn

from kinfolk.errors import AdapterBaseMismatchError, AdapterConfigError, AdapterConfigMismatchError
from kinfolk.layout import UnsupportedArchitectureError, layout_from_config
from kinfolk.plugins.atlas.base_check import check_and_record
from kinfolk.plugins.atlas.config import DEFAULT_RELATIVE_DEPTH, AtlasConfig
from kinfolk.plugins.atlas.layer import ATLAS_BUFFERS, AtlasLayer, AtlasLinear
from kinfolk.plugins.atlas.saved import config_mismatch


class AtlasModel(BaseTuner):
    """Creates ATLAS adapters on a model's `nn.Linear` modules (see `kinfolk.plugins.atlas.layer`)."""

    prefix: str = "atlas_"
    tuner_layer_cls = AtlasLayer
    target_module_mapping: ClassVar[dict[str, list[str]]] = {}

    def _prepare_adapter_config(self, peft_config: AtlasConfig, model_config: dict) -> AtlasConfig:
        if peft_config.target_modules is None:
            target_modules, layers = default_placement(self.model)
            peft_config.target_modules = target_modules
            if peft_config.layers_to_transform is None:
                peft_config.layers_to_transform = layers
        return peft_config

    def _create_and_replace(
        self, atlas_config, adapter_name, target, target_name, parent, current_key, **optional_kwargs
    ) -> None:
        base = target.get_base_layer() if isinstance(target, BaseTunerLayer) else target
        if not isinstance(base, nn.Linear):
            raise TypeError(
                f"ATLAS adapts torch.nn.Linear modules only; {current_key} is a {type(base).__name__}. Narrow "
                f"target_modules."
            )
        check_and_record(atlas_config, current_key, base.weight, getattr(self.model, "name_or_path", None))
        try:
            if isinstance(target, AtlasLinear):
                target.update_layer(adapter_name, atlas_config)
                return
            new_module = AtlasLinear(target, adapter_name, atlas_config)
        except AdapterConfigError as error:
            raise AdapterConfigError(f"{current_key}: {error}") from None
        if adapter_name not in self.active_adapters:
            new_module.requires_grad_(False)
        self._replace_module(parent, target_name, new_module, target)

    def _cast_adapter_dtype(self, adapter_name: str, autocast_adapter_dtype: bool = True) -> None:
        # PEFT up-casts every half-precision adapter tensor to fp32; the atlas keeps the dtype its config asks for.
        super()._cast_adapter_dtype(adapter_name, autocast_adapter_dtype)
        dtype = self.peft_config[adapter_name].torch_atlas_dtype
        for layer in self._atlas_layers(adapter_name):
            for name in ATLAS_BUFFERS:
                getattr(layer, name)[adapter_name] = getattr(layer, name)[adapter_name].to(dtype)

    def atlas_nbytes(self, adapter_name: str | None = None) -> int:
        """Bytes of the atlas buffers of one adapter (default: the active one) over all its layers."""
        adapter_name = adapter_name or self.active_adapters[0]
        return sum(layer.atlas_nbytes(adapter_name) for layer in self._atlas_layers(adapter_name))

    def _atlas_layers(self, adapter_name: str) -> list[AtlasLayer]:
        return [m for m in self.model.modules() if isinstance(m, AtlasLayer) and adapter_name in m.atlas_A]

    @classmethod
    def _remap_adapter_state_dict_for_load(cls, model, config, adapter_name, state_dict):
        remapped = super()._remap_adapter_state_dict_for_load(model, config, adapter_name, state_dict)
        expected = model.state_dict()
        mismatched = [
            f"{key}: checkpoint {tuple(value.shape)}, model {tuple(expected[key].shape)}"
            for key, value in remapped.items()
            if key in expected and tuple(expected[key].shape) != tuple(value.shape)
        ]
        if mismatched:
            problem = config_mismatch(
                {key: value.shape for key, value in remapped.items()},
                config.r,
                config.num_regions,
                config.num_directions,
            )
            if problem is not None:  # the adapter disagrees with its own config, whatever the base
                raise AdapterConfigMismatchError(problem)
            raise AdapterBaseMismatchError(
                f"this ATLAS adapter was trained and fitted on a base model of another width: {len(mismatched)} "
                f"adapter tensors do not fit the modules they load into ({'; '.join(mismatched[:3])}). Load it onto the "
                f"base model it was made for (adapter_config.json: base_model_name_or_path="
                f"{getattr(config, 'base_model_name_or_path', None)!r})."
            )
        return remapped


def default_placement(model: nn.Module) -> tuple[set[str], list[int]]:
    """ATLAS's default targets: the attention output projection of the one decoder layer at 47% depth."""
    try:
        layout = layout_from_config(model.config)
    except (UnsupportedArchitectureError, AttributeError) as error:
        raise ValueError(
            f"AtlasConfig.target_modules is not set and the default placement (attention output projection) is "
            f"unknown for this model ({error}); pass target_modules, e.g. ['lin0']"
        ) from None
    return {layout.attention_output}, [default_layer(layout.num_layers)]


def default_layer(num_layers: int) -> int:
    """The zero-based decoder layer at the paper's relative depth (17 of 36)."""
    return min(num_layers - 1, round(DEFAULT_RELATIVE_DEPTH * num_layers))
