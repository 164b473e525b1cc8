"""Where things are inside a Hugging Face causal LM: the decoder-layer list, its state-dict prefix, the attention
output projection, the embeddings / final norm / LM head, tied heads and per-layer config lists.

Known architectures are listed explicitly; anything else gets an error that names the model type, because a
wrong guess here would silently merge or adapt the wrong tensors.

>>> from kinfolk.testing import build_model
>>> layout = model_layout(build_model("qwen2", "small"))
>>> layout.layer_prefix, layout.attention_output, layout.num_layers
('model.layers', 'self_attn.o_proj', 2)
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from torch import nn
from transformers import PretrainedConfig

from kinfolk.errors import UnsupportedArchitectureError

# model_type -> names shared by the Llama-style decoders kinfolk supports.
_LLAMA_STYLE = {
    "layer_prefix": "model.layers",
    "embeddings": "model.embed_tokens",
    "final_norm": "model.norm",
    "lm_head": "lm_head",
    "attention_output": "self_attn.o_proj",
    "mlp_output": "mlp.down_proj",
}
SUPPORTED_MODEL_TYPES = {
    model_type: _LLAMA_STYLE
    for model_type in (
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "gemma",
        "gemma2",
        "gemma3_text",
        "olmo",
        "olmo2",
        "olmo3",
    )
}


@dataclass(frozen=True)
class ModelLayout:
    model_type: str
    num_layers: int
    layer_prefix: str
    embeddings: str
    final_norm: str
    lm_head: str
    attention_output: str
    mlp_output: str
    tied_embeddings: bool

    def layer_key(self, index: int) -> str:
        return f"{self.layer_prefix}.{index}"

    def layer_of(self, tensor_name: str) -> int | None:
        """The decoder-layer index a state-dict key belongs to, or None for embeddings, norm and head."""
        match = re.match(rf"{re.escape(self.layer_prefix)}\.(\d+)\.", tensor_name)
        return int(match.group(1)) if match else None

    def rename_layer(self, tensor_name: str, new_index: int) -> str:
        """`model.layers.7.mlp.up_proj.weight` -> `model.layers.{new_index}.mlp.up_proj.weight`."""
        old = self.layer_of(tensor_name)
        if old is None:
            raise ValueError(f"{tensor_name!r} is not inside a decoder layer ({self.layer_prefix}.N.*)")
        return tensor_name.replace(f"{self.layer_prefix}.{old}.", f"{self.layer_prefix}.{new_index}.", 1)

    def attention_output_module(self, layer: int) -> str:
        """Full module name of the attention output projection of `layer` (the ATLAS default placement)."""
        return f"{self.layer_key(layer)}.{self.attention_output}"


def _text_config(config: PretrainedConfig) -> PretrainedConfig:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def ties_embeddings(config: PretrainedConfig) -> bool:
    """Whether the LM head shares the input embedding matrix (Gemma and small Qwen/Llama do by default)."""
    text = _text_config(config)
    return bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))


def layout_from_config(config: PretrainedConfig) -> ModelLayout:
    text = _text_config(config)
    model_type = text.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedArchitectureError(
            f"kinfolk does not know the layout of model type {model_type!r}; supported: "
            f"{', '.join(sorted(SUPPORTED_MODEL_TYPES))}"
        )
    return ModelLayout(
        model_type=model_type,
        num_layers=int(text.num_hidden_layers),
        tied_embeddings=ties_embeddings(config),
        **SUPPORTED_MODEL_TYPES[model_type],
    )


def check_state_dict_layout(layout: ModelLayout, tensor_names: Iterable[str]) -> None:
    """Confirm a checkpoint's tensor names match the layout (right prefix, every layer present)."""
    names = list(tensor_names)
    layers = {layout.layer_of(name) for name in names} - {None}
    expected = set(range(layout.num_layers))
    if layers != expected:
        missing, extra = sorted(expected - layers), sorted(layers - expected)
        raise UnsupportedArchitectureError(
            f"{layout.model_type}: config says {layout.num_layers} layers under {layout.layer_prefix!r}, but the "
            f"checkpoint's layers differ (missing {missing[:8]}, unexpected {extra[:8]})"
        )
    if not any(name.startswith(layout.embeddings + ".") for name in names):
        raise UnsupportedArchitectureError(f"{layout.model_type}: no {layout.embeddings}.* tensor in the checkpoint")


def base_model(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper; any other model as it is. (For accelerate's wrappers, call
    `accelerator.unwrap_model` first.)"""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def model_layout(model: nn.Module) -> ModelLayout:
    """The layout of a loaded model (a PEFT wrapper is looked through)."""
    base = base_model(model)
    layout = layout_from_config(base.config)
    check_state_dict_layout(layout, (name for name, _ in base.named_parameters(remove_duplicate=False)))
    return layout


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's `nn.ModuleList` of decoder layers."""
    base = base_model(model)
    return base.get_submodule(layout_from_config(base.config).layer_prefix)


def per_layer_config_fields(config: PretrainedConfig) -> list[str]:
    """Config attributes that hold one entry per decoder layer (e.g. Gemma 2's and Qwen's `layer_types`)."""
    text = _text_config(config)
    count = text.num_hidden_layers
    return sorted(
        name
        for name, value in text.to_dict().items()
        if isinstance(value, list) and len(value) == count and name not in ("architectures",)
    )


def select_layers_config(config: PretrainedConfig, keep: Sequence[int]) -> PretrainedConfig:
    """A copy of `config` for a model made of layers `keep` (in that order) of the original.

    `num_hidden_layers` and every per-layer list are rewritten together (transformers 5 validates that
    `layer_types` has one entry per layer), so the result loads.
    """
    text_source = _text_config(config)
    count = text_source.num_hidden_layers
    bad = [index for index in keep if not 0 <= index < count]
    if bad:
        raise ValueError(f"layer indices {bad} are outside 0..{count - 1}")
    fields = per_layer_config_fields(config)
    new = copy.deepcopy(config)
    text = _text_config(new)
    for name in fields:
        values = getattr(text_source, name)
        setattr(text, name, [values[index] for index in keep])
    text.num_hidden_layers = len(keep)
    return new
