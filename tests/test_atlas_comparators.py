"""LoRA and CorDA-KPM at ATLAS's placement and rank, and the comparison example script on the tiny kit."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from kinfolk.plugins.atlas import AtlasConfig
from kinfolk.plugins.atlas_comparators import corda_kpm_model, matching_lora_config
from kinfolk.testing import prompt_completion_dataset, text_dataset

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "atlas_comparators.py"
IDS = torch.tensor([[3, 17, 29, 41, 5, 8]])


def trainable(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("fields", [{"r": 4}, {"r": 2, "layers_to_transform": [0, 1]}])
def test_lora_matches_atlas_placement_and_parameter_count(tiny_kit, fields):
    path = tiny_kit.model_dir("llama")
    atlas = get_peft_model(AutoModelForCausalLM.from_pretrained(path), AtlasConfig(**fields))
    base = AutoModelForCausalLM.from_pretrained(path)
    lora = get_peft_model(base, matching_lora_config(base, AtlasConfig(**fields)))
    assert sorted(lora.base_model.targeted_module_names) == sorted(atlas.base_model.targeted_module_names)
    assert trainable(lora) == trainable(atlas)


def test_corda_kpm_starts_at_the_base_and_its_converted_adapter_loads_on_the_original(
    tiny_kit, tiny_tokenizer, tmp_path
):
    path = tiny_kit.model_dir("qwen2")
    original = AutoModelForCausalLM.from_pretrained(path)
    model = corda_kpm_model(
        AutoModelForCausalLM.from_pretrained(path), AtlasConfig(r=4), text_dataset(24), tiny_tokenizer
    )
    torch.testing.assert_close(model(IDS).logits, original(IDS).logits, atol=1e-5, rtol=1e-5)
    model.save_pretrained(tmp_path / "init")
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(IDS, labels=IDS).loss.backward()
    optimizer.step()
    trained = model(IDS).logits
    assert not torch.allclose(trained, original(IDS).logits, atol=1e-4)
    model.save_pretrained(tmp_path / "final", path_initial_model_for_weight_conversion=str(tmp_path / "init"))
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), tmp_path / "final")
    torch.testing.assert_close(loaded(IDS).logits, trained, atol=1e-5, rtol=1e-5)


def test_comparison_example_trains_all_three_at_equal_size(tiny_kit, tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("atlas_comparators", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, example)  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(example)
    prompt_completion_dataset(12).to_json(tmp_path / "target.jsonl")
    text_dataset(12, seed=5).to_json(tmp_path / "retained.jsonl")
    path = tiny_kit.model_dir("qwen3")
    summary = example.main(
        [
            "--model_name_or_path", str(path),
            "--train_dataset", str(tmp_path / "target.jsonl"),
            "--atlas_retained_dataset", str(tmp_path / "retained.jsonl"),
            "--atlas_r", "4", "--atlas_regions", "2",
            "--output_dir", str(tmp_path / "out"),
            "--max_steps", "2", "--per_device_train_batch_size", "4", "--learning_rate", "1e-2",
            "--use_cpu", "--report_to", "none", "--save_strategy", "no",
        ]
    )  # fmt: skip
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == summary
    assert {m["trainable_parameters"] for m in summary.values()} == {2 * 4 * 32}
    assert {tuple(m["targets"]) for m in summary.values()} == {("model.layers.1.self_attn.o_proj",)}
    base = AutoModelForCausalLM.from_pretrained(path)
    reference = base(IDS).logits
    for method, entry in summary.items():
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), entry["adapter"])
        logits = loaded(IDS).logits
        assert torch.isfinite(logits).all() and not torch.equal(logits, reference), method
