"""ATLAS adapters: a saved adapter that contradicts its own config, a truncated one, a rank wider than its module,
and empty retained data are each refused with one line naming the field, file or module."""

import json
import shutil

import pytest
import torch
from peft import PeftModel, get_peft_model
from refusal_helpers import assert_refused
from torch import nn
from transformers import AutoModelForCausalLM

from kinfolk.errors import (
    AdapterBaseMismatchError,
    AdapterConfigError,
    AdapterConfigMismatchError,
    CorruptFileError,
    EmptyDatasetError,
)
from kinfolk.plugins.atlas import AtlasConfig, fit_atlas
from kinfolk.testing import text_dataset


@pytest.fixture(scope="module")
def saved_adapter(tiny_kit, tmp_path_factory):
    """An ATLAS adapter (r=4, K=3, p=2) on the small qwen3, saved."""
    path = tiny_kit.model_dir("qwen3")
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path), AtlasConfig(r=4, num_regions=3, num_directions=2)
    )
    directory = tmp_path_factory.mktemp("adapter") / "adapter"
    model.save_pretrained(directory)
    return {"base": path, "adapter": directory}


def edited_adapter(saved_adapter, tmp_path, **fields):
    copy = shutil.copytree(saved_adapter["adapter"], tmp_path / "adapter")
    config = json.loads((copy / "adapter_config.json").read_text())
    config.update(fields)
    (copy / "adapter_config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("r", 8, ["r=8", "r=4"]),
        ("r", 2, ["r=2", "r=4"]),
        ("num_regions", 5, ["num_regions=5", "num_regions=3"]),
        ("num_directions", 1, ["num_directions=1", "have 2"]),
    ],
)
def test_an_edited_config_field_is_named_with_both_values(saved_adapter, tmp_path, field, value, named):
    adapter = edited_adapter(saved_adapter, tmp_path, **{field: value})
    base = AutoModelForCausalLM.from_pretrained(saved_adapter["base"])
    error = assert_refused(
        lambda: PeftModel.from_pretrained(base, adapter),
        AdapterConfigMismatchError,
        adapter / "adapter_config.json",
        f"was '{field}' edited after saving",
        *named,
        inputs=[adapter, saved_adapter["base"]],
    )
    assert "another width" not in str(error)


def test_a_truncated_adapter_file_is_named(saved_adapter, tmp_path):
    adapter = shutil.copytree(saved_adapter["adapter"], tmp_path / "adapter")
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    base = AutoModelForCausalLM.from_pretrained(saved_adapter["base"])
    assert_refused(lambda: PeftModel.from_pretrained(base, adapter), CorruptFileError, weights, "truncated")


def test_loading_onto_another_width_is_still_reported_as_such(saved_adapter, tiny_kit):
    large = AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("qwen3", "large"))
    assert_refused(
        lambda: PeftModel.from_pretrained(large, saved_adapter["adapter"]),
        AdapterBaseMismatchError,
        "base model of another width",
    )


def test_the_unedited_adapter_still_loads_bit_exact(saved_adapter):
    base = AutoModelForCausalLM.from_pretrained(saved_adapter["base"])
    loaded = PeftModel.from_pretrained(base, saved_adapter["adapter"])
    ids = torch.arange(8).unsqueeze(0)
    assert torch.isfinite(loaded(ids).logits).all()


class Narrow(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = nn.Linear(6, 5)
        self.lin1 = nn.Linear(5, 3)

    def forward(self, x):
        return self.lin1(self.lin0(x))


@pytest.mark.parametrize(("module", "r", "widest"), [("lin0", 7, 6), ("lin1", 6, 5)])
def test_a_rank_wider_than_the_module_is_refused(module, r, widest):
    assert_refused(
        lambda: get_peft_model(Narrow(), AtlasConfig(target_modules=[module], r=r)),
        AdapterConfigError,
        module,
        f"r={r}",
        f"r <= {widest}",
    )
    get_peft_model(Narrow(), AtlasConfig(target_modules=[module], r=widest))  # the widest rank is accepted


def test_a_rank_wider_than_a_causal_lms_projection_is_refused(tiny_kit):
    model = AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama"))
    width = model.config.hidden_size
    assert_refused(
        lambda: get_peft_model(model, AtlasConfig(r=10 * width)),
        AdapterConfigError,
        "self_attn.o_proj",
        f"r={10 * width}",
    )


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ("empty dataset", "the retained dataset has no rows"),
        ("empty loader", "gave no batches"),
        ("prompt only", "no completion token is left"),
    ],
)
def test_fit_atlas_refuses_retained_data_with_nothing_to_fit(tiny_kit, tiny_tokenizer, data, named):
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama")), AtlasConfig(r=4))
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    source = {
        "empty dataset": text_dataset(3).select([]),
        "empty loader": [],
        "prompt only": [{"input_ids": torch.arange(6).view(1, 6), "labels": torch.full((1, 6), -100)}],
    }[data]
    assert_refused(
        lambda: fit_atlas(model, source, tokenizer=tiny_tokenizer, mask_prompt=True, progress=False),
        EmptyDatasetError,
        named,
    )
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


# --- the config's own fields (what `kinfolk sft --atlas_*` builds) --------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"r": 0}, "r must be a positive integer, got 0"),
        ({"num_regions": 0}, "num_regions must be a positive integer, got 0"),
        ({"num_directions": -1}, "num_directions must be a positive integer, got -1"),
        ({"residual": "lora"}, "residual='lora' is not an ATLAS variant"),
        ({"atlas_dtype": "int8"}, "atlas_dtype='int8'"),
        ({"routing_temperature": 0.0}, "routing_temperature must be > 0"),
        ({"target_modules": ".*proj", "layers_to_transform": [0]}, "`layers_to_transform` cannot be used"),
    ],
)
def test_an_atlas_config_with_a_bad_field_is_refused_naming_it(fields, named):
    assert_refused(lambda: AtlasConfig(**fields), AdapterConfigError, named)
