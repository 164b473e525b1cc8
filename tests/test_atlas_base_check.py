"""An ATLAS adapter records the base weights it was made on and notices another base of the same width: a warning by
default, an `AdapterBaseMismatchError` under `base_mismatch="error"` or `KINFOLK_ATLAS_BASE_MISMATCH=error`; the
same checkpoint in another dtype is the same base."""

import json
import logging

import pytest
import torch
from peft import PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from kinfolk.errors import AdapterBaseMismatchError
from kinfolk.plugins.atlas import AtlasConfig
from kinfolk.plugins.atlas import base_check as base_check_module
from kinfolk.plugins.atlas.base_check import MISMATCH_ENV, weight_fingerprint
from kinfolk.testing import build_model

TARGET = "model.layers.1.self_attn.o_proj"


@pytest.fixture(scope="module")
def saved_adapter(tmp_path_factory):
    """An adapter made on layer 1 of a seed-0 tiny Llama, saved beside that base."""
    root = tmp_path_factory.mktemp("atlas-base-check")
    build_model("llama", "large", seed=0).save_pretrained(root / "base")
    base = AutoModelForCausalLM.from_pretrained(root / "base")  # its name_or_path is recorded too
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = get_peft_model(base, AtlasConfig(r=4, layers_to_transform=[1], init_weights=False))
    model.save_pretrained(root / "adapter")
    return root


def load(base, adapter, **config_overrides):
    config = AtlasConfig.from_pretrained(adapter)
    for name, value in config_overrides.items():
        setattr(config, name, value)
    return PeftModel.from_pretrained(base, adapter, config=config)


def warnings_of(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == base_check_module.__name__]


def test_the_adapter_config_records_a_hash_of_each_adapted_base_weight(saved_adapter):
    recorded = json.loads((saved_adapter / "adapter" / "adapter_config.json").read_text())["base_fingerprints"]
    base = AutoModelForCausalLM.from_pretrained(saved_adapter / "base")
    assert recorded == {TARGET: weight_fingerprint(base.get_submodule(TARGET).weight)}


def test_the_same_base_in_another_dtype_loads_without_a_word(saved_adapter, caplog):
    for dtype in (torch.float32, torch.bfloat16):
        base = AutoModelForCausalLM.from_pretrained(saved_adapter / "base", dtype=dtype)
        with caplog.at_level(logging.WARNING):
            load(base, saved_adapter / "adapter", base_mismatch="error")
    assert warnings_of(caplog) == []


def test_another_model_of_the_same_width_warns_naming_the_module(saved_adapter, caplog):
    other = build_model("llama", "large", seed=1)  # same architecture and widths, other weights
    with caplog.at_level(logging.WARNING):
        load(other, saved_adapter / "adapter")
    (warning,) = warnings_of(caplog)
    assert warning.startswith(f"{TARGET}: this ATLAS adapter was made on another base module")
    assert str(saved_adapter / "base") in warning and "\n" not in warning


def test_a_student_whose_layer_is_another_of_the_teachers_layers_is_noticed(saved_adapter, caplog):
    """The ADAPT case: a student keeps the teacher's layers 0 and 2, so its layer 1 is the teacher's layer 2."""
    teacher = AutoModelForCausalLM.from_pretrained(saved_adapter / "base")
    student = build_model("llama", "large", seed=0)
    with torch.no_grad():
        student.model.layers[1].load_state_dict(teacher.model.layers[2].state_dict())
    with pytest.raises(AdapterBaseMismatchError, match=f"{TARGET}: this ATLAS adapter was made on another base"):
        load(student, saved_adapter / "adapter", base_mismatch="error")


def test_the_environment_variable_makes_a_mismatch_an_error(saved_adapter, monkeypatch):
    monkeypatch.setenv(MISMATCH_ENV, "error")
    with pytest.raises(AdapterBaseMismatchError):
        load(build_model("llama", "large", seed=1), saved_adapter / "adapter")


def test_an_adapter_saved_before_fingerprints_loads_unchecked(saved_adapter, tmp_path, caplog):
    import shutil

    old = shutil.copytree(saved_adapter / "adapter", tmp_path / "old")
    config = json.loads((old / "adapter_config.json").read_text())
    del config["base_fingerprints"], config["base_mismatch"]
    (old / "adapter_config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING):
        load(build_model("llama", "large", seed=1), old)
    assert warnings_of(caplog) == []


def test_a_bad_policy_is_refused():
    from kinfolk.errors import AdapterConfigError

    with pytest.raises(AdapterConfigError, match="base_mismatch='strict'; choose one of warn, error"):
        AtlasConfig(base_mismatch="strict")
