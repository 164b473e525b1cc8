import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from kinfolk.layout import (
    UnsupportedArchitectureError,
    check_state_dict_layout,
    decoder_layers,
    layout_from_config,
    model_layout,
    per_layer_config_fields,
    select_layers_config,
)
from kinfolk.testing import ARCHITECTURES, build_model, tiny_config


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_layout_names_real_modules(architecture):
    model = build_model(architecture, "large")
    layout = model_layout(model)
    assert layout.num_layers == 4 == len(decoder_layers(model))
    modules = dict(model.named_modules())
    for layer in range(layout.num_layers):
        assert layout.attention_output_module(layer) in modules
        assert f"{layout.layer_key(layer)}.{layout.mlp_output}" in modules
    for name in (layout.embeddings, layout.final_norm, layout.lm_head):
        assert name in modules
    assert layout.tied_embeddings == (model.get_output_embeddings().weight is model.get_input_embeddings().weight)


def test_layer_of_and_rename():
    layout = layout_from_config(tiny_config("llama"))
    assert layout.layer_of("model.layers.12.mlp.up_proj.weight") == 12
    assert layout.layer_of("model.embed_tokens.weight") is None
    assert layout.rename_layer("model.layers.12.mlp.up_proj.weight", 3) == "model.layers.3.mlp.up_proj.weight"
    with pytest.raises(ValueError, match="decoder layer"):
        layout.rename_layer("lm_head.weight", 0)


def test_unknown_architecture_is_named():
    config = AutoConfig.for_model("gpt2", n_layer=2, n_embd=32, n_head=2)
    with pytest.raises(UnsupportedArchitectureError, match="'gpt2'"):
        layout_from_config(config)


def test_checkpoint_with_missing_layer_is_refused():
    layout = layout_from_config(tiny_config("qwen2"))
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.o_proj.weight"]
    with pytest.raises(UnsupportedArchitectureError, match=r"missing \[1\]"):
        check_state_dict_layout(layout, names)


@pytest.mark.parametrize("architecture", ["gemma2", "qwen3", "llama"])
def test_select_layers_config_keeps_per_layer_lists_consistent(architecture):
    config = tiny_config(architecture, "large")
    fields = per_layer_config_fields(config)
    if architecture in ("gemma2", "qwen3"):
        assert "layer_types" in fields
    if architecture == "gemma2":  # alternate sliding / full, so the selection order is visible
        config.layer_types = ["sliding_attention", "full_attention"] * 2
    new = select_layers_config(config, [0, 3])
    assert new.num_hidden_layers == 2 and config.num_hidden_layers == 4
    for name in fields:
        assert getattr(new, name) == [getattr(config, name)[0], getattr(config, name)[3]]
    AutoModelForCausalLM.from_config(new)  # transformers validates layer_types against num_hidden_layers
    with pytest.raises(ValueError, match="outside"):
        select_layers_config(config, [4])
