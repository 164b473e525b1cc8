"""ATLAS through TRL: `SFTTrainer(peft_config=AtlasConfig(...))`, with the atlas fitted before training."""

import pytest
import torch
from peft import PeftModel, get_peft_model
from transformers import AutoModelForCausalLM
from trl import SFTConfig, SFTTrainer, TrlParser

from kinfolk.commands.sft_atlas_options import AtlasArguments
from kinfolk.plugins.atlas import AtlasConfig, fit_atlas
from kinfolk.plugins.atlas.layer import ATLAS_BUFFERS
from kinfolk.testing import prompt_completion_dataset, text_dataset
from kinfolk.tokens import sft_tokenize


def test_sft_trainer_trains_only_a_and_b_of_a_fitted_atlas(tiny_kit, tiny_tokenizer, tmp_path):
    path = tiny_kit.model_dir("qwen3")
    args = SFTConfig(
        output_dir=str(tmp_path / "run"),
        report_to="none",
        use_cpu=True,
        bf16=False,
        max_steps=4,
        per_device_train_batch_size=4,
        learning_rate=5e-2,
        logging_steps=1,
        save_strategy="no",
    )
    trainer = SFTTrainer(
        model=str(path),
        args=args,
        train_dataset=prompt_completion_dataset(16),
        processing_class=tiny_tokenizer,
        peft_config=AtlasConfig(r=4, num_regions=2, num_directions=3),
    )
    model = trainer.model
    assert isinstance(model, PeftModel)
    fit_atlas(model, text_dataset(12, seed=3), tokenizer=tiny_tokenizer, progress=False)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer.train()
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v.detach(), before[k])}
    assert changed == {
        "base_model.model.model.layers.1.self_attn.o_proj.atlas_A.default",
        "base_model.model.model.layers.1.self_attn.o_proj.atlas_B.default",
    }
    assert all(torch.isfinite(torch.tensor(log["loss"])) for log in trainer.state.log_history if "loss" in log)
    model.save_pretrained(tmp_path / "adapter")
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), tmp_path / "adapter")
    layer = loaded.base_model.model.model.layers[1].self_attn.o_proj
    trained = model.base_model.model.model.layers[1].self_attn.o_proj
    for name in ATLAS_BUFFERS:
        assert torch.equal(getattr(layer, name)["default"], getattr(trained, name)["default"].cpu())
    ids = torch.tensor([[3, 17, 29, 41]])
    model.eval()
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_atlas_options_parse_from_yaml_and_fit_from_a_retained_file(tiny_kit, tiny_tokenizer, tmp_path):
    retained = tmp_path / "retained.jsonl"
    text_dataset(10, seed=4).to_json(retained)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"output_dir: {tmp_path / 'out'}\nuse_cpu: true\nbf16: false\nuse_atlas: true\natlas_retained_dataset: {retained}\n"
        "atlas_layers: [0]\natlas_r: 8\natlas_residual: centered\natlas_regions: 1\natlas_retained_samples: 6\n"
    )
    _, atlas_args = TrlParser((SFTConfig, AtlasArguments)).parse_args_and_config(["--config", str(config)])
    peft_config = atlas_args.peft_config()
    assert (peft_config.r, peft_config.residual, peft_config.num_regions) == (8, "centered", 1)
    assert peft_config.layers_to_transform == [0] and peft_config.task_type == "CAUSAL_LM"
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama")), peft_config)
    report = atlas_args.fit(model, tiny_tokenizer, progress=False)
    assert report.modules == ["base_model.model.model.layers.0.self_attn.o_proj"]
    expected = sum(
        len(ids) for ids in sft_tokenize(text_dataset(10, seed=4).select(range(6)), tiny_tokenizer)["input_ids"]
    )
    assert report.tokens == expected


def test_atlas_options_need_retained_data():
    with pytest.raises(ValueError, match="--atlas_retained_dataset"):
        AtlasArguments(use_atlas=True).retained_dataset()
