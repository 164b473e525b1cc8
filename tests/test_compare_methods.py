"""The method registry (`kinfolk.compare.methods`), one entry per method, against hand counts and the places that
read it: each method's trainable parameters on a tiny Llama (LoRA and ATLAS r·(in + out), OSF r·(in + out + 1),
full fine-tuning every weight), its settings are `kinfolk compare` options, its line is in docs/compare.md, and the
lab's ATLAS method names build the registry's adapters."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from peft import get_peft_model

from kinfolk.compare.methods import METHODS
from kinfolk.compare.options import CompareArguments
from kinfolk.lab.methods.atlas.settings import METHODS as LAB_METHODS
from kinfolk.lab.methods.atlas.settings import REGULARISERS, registry_method
from kinfolk.plugins.atlas import AtlasConfig
from kinfolk.testing import build_model

DOCS = Path(__file__).resolve().parents[1] / "docs" / "compare.md"
RANK, LAYER = 4, 1


def trainable(model) -> int:
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)


@pytest.mark.parametrize("name", list(METHODS))
def test_each_method_trains_what_its_entry_says_at_atlas_placement(name):
    model = build_model("llama", "small")
    weight = model.model.layers[LAYER].self_attn.o_proj.weight
    out_features, in_features = weight.shape
    everything = sum(parameter.numel() for parameter in model.parameters())
    placement = AtlasConfig(r=RANK, layers_to_transform=[LAYER], target_modules=["self_attn.o_proj"])
    config = METHODS[name].peft_config(model, placement)
    expected = {
        "lora": RANK * (in_features + out_features),
        "atlas": RANK * (in_features + out_features),  # A (r x in) and B (out x r), as LoRA's
        "osf": RANK * (in_features + out_features + 1),  # r singular directions: U's and V's columns and sigma
        "full": everything,
    }[METHODS[name].adapter]
    adapted = model if config is None else get_peft_model(model, config)
    assert trainable(adapted) == expected
    if config is not None:  # only the placement's one module is adapted
        changed = {n for n, p in adapted.named_parameters() if p.requires_grad}
        assert all(f"layers.{LAYER}.self_attn.o_proj" in n for n in changed)


def test_entries_name_their_options_residuals_and_regularisers():
    fields = {field.name for field in dataclasses.fields(CompareArguments)}
    for method in METHODS.values():
        assert set(method.settings) <= fields, method.name
        assert method.regulariser is None or method.regulariser in method.settings
    assert {m.residual for m in METHODS.values() if m.adapter == "atlas"} == {"atlas", "norm_matched"}
    assert {n: m.regulariser for n, m in METHODS.items() if m.regulariser} == {
        "lora_output_kl": "output_kl_coef",
        "lora_replay": "replay_ratio",
    }
    with pytest.raises(ValueError, match="adapter 'atlas' with residual None"):
        dataclasses.replace(METHODS["atlas"], residual=None)


def test_every_method_has_its_line_in_docs_and_in_the_help():
    text = DOCS.read_text(encoding="utf-8")
    help_text = next(f.metadata["help"] for f in dataclasses.fields(CompareArguments) if f.name == "methods")
    for name, method in METHODS.items():
        assert f"| `{name}` |" in text, f"docs/compare.md has no row for {name}"
        assert f"{name}: {method.help}" in help_text


def test_the_lab_names_build_the_registry_methods():
    mapped = {name: registry_method(name) for name in LAB_METHODS if name != "corda"}  # CorDA: the lab's own
    assert {name: m.name for name, m in mapped.items() if m.adapter != "atlas"} == {
        "lora": "lora",
        "lora+replay": "lora_replay",
        "lora+output-kl": "lora_output_kl",
    }
    residuals = {name: m.residual for name, m in mapped.items() if m.adapter == "atlas"}
    assert residuals == {"plain": "plain", "centered": "centered", "atlas": "atlas", "norm-matched": "norm_matched"}
    assert REGULARISERS == {"lora+replay": "replay_ratio", "lora+output-kl": "output_kl_coef"}
    assert registry_method("osf") is METHODS["osf"]
