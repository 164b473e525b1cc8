"""Defaults of kinfolk's training configs. CPU: without an accelerator they train on the CPU in fp32 (TRL's default
would be bf16, refused without `use_cpu` and CPU-autocast with it), an explicit choice is kept, and the choice is
said once. The trained in-memory model computes what its saved weights compute."""

import logging

import pytest
import torch
from peft import LoraConfig
from sft_helpers import weighted_data, weighted_trainer

from kinfolk.commands import env as env_command
from kinfolk.testing import build_model
from kinfolk.trainers import WeightedSFTConfig
from kinfolk.trainers import config_defaults as config_defaults_module
from kinfolk.trainers.config_defaults import SAID_ENV, device_defaults
from kinfolk.trainers.layer_distillation_config import LayerDistillationConfig


@pytest.fixture
def cpu_only(monkeypatch):
    """A machine without an accelerator, whatever this one has; the choice not said yet in this process tree."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(SAID_ENV, raising=False)


class Options:
    def __init__(self, use_cpu=False, bf16=None, fp16=False):
        self.use_cpu, self.bf16, self.fp16 = use_cpu, bf16, fp16


@pytest.mark.parametrize(
    ("given", "accelerator", "bf16_accelerator", "expected"),
    [
        ({}, False, False, (True, False)),  # CPU machine: the CPU, in fp32
        ({"use_cpu": True}, True, True, (True, False)),  # the CPU asked for on a GPU machine: fp32 too
        ({"bf16": True}, False, False, (True, True)),  # bf16 asked for: kept (CPU autocast)
        ({}, True, True, (False, None)),  # a bf16 GPU: left to TRL (bf16)
        ({}, True, False, (False, False)),  # a GPU without bf16: fp32 rather than TRL's refusal
        ({"fp16": True}, True, False, (False, None)),  # fp16 asked for: bf16 left unset
    ],
)
def test_only_unset_choices_are_made_for_the_hardware(given, accelerator, bf16_accelerator, expected):
    options = Options(**given)
    device_defaults(options, accelerator=accelerator, bf16_accelerator=bf16_accelerator)
    assert (options.use_cpu, options.bf16) == expected


@pytest.mark.parametrize("config_class", [WeightedSFTConfig, LayerDistillationConfig])
def test_a_config_on_a_cpu_machine_trains_in_fp32_on_the_cpu_and_says_so_once(
    config_class, cpu_only, tmp_path, caplog
):
    with caplog.at_level(logging.WARNING, logger=config_defaults_module.__name__):
        config = config_class(output_dir=str(tmp_path))  # TRL alone: "You need to assign use_cpu"
        again = config_class(output_dir=str(tmp_path), bf16=True)
    assert (config.use_cpu, config.bf16) == (True, False)
    assert (again.use_cpu, again.bf16) == (True, True)
    said = [record.getMessage() for record in caplog.records]
    assert (
        len(said) == 1 and "training in fp32 (for CPU bf16 autocast: --bf16 true on kinfolk sft and distil)" in said[0]
    )


def test_the_trained_model_in_memory_computes_what_its_saved_adapter_computes(tiny_tokenizer, cpu_only, tmp_path):
    from peft import PeftModel

    trainer = weighted_trainer(
        tiny_tokenizer,
        weighted_data(8),
        tmp_path / "run",
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
        bf16=None,  # unset, as on the command line: the default decides
        use_cpu=False,
    )
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    inputs = tiny_tokenizer(["1 + 2 = 3", "7 + 1 = 8"], return_tensors="pt", padding=True)
    trainer.model.eval()
    with torch.no_grad():
        in_memory = trainer.model(**inputs).logits
        reloaded = PeftModel.from_pretrained(build_model("llama", tokenizer=tiny_tokenizer), tmp_path / "saved")
        saved = reloaded.eval()(**inputs).logits
    assert in_memory.dtype == torch.float32
    assert torch.equal(in_memory, saved)


def test_env_does_not_call_cpu_bf16_supported(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    shown = env_command.format_environment(env_command.collect_environment())
    (bf16_line,) = [line for line in shown.splitlines() if line.startswith("bf16")]
    assert "supported" not in bf16_line.replace("not supported", "") and "fp32" in bf16_line


@pytest.mark.parametrize("config_class", [WeightedSFTConfig, LayerDistillationConfig])
def test_trls_checkpointing_default_carries_to_the_new_name_without_a_deprecation_warning(config_class, tmp_path):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        default = config_class(output_dir=str(tmp_path), use_cpu=True, bf16=False)
        off = config_class(output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False)
    assert [str(w.message) for w in caught if "gradient_checkpointing" in str(w.message)] == []
    assert (default.activation_checkpointing, default.gradient_checkpointing) == (True, True)  # TRL's default
    assert (off.activation_checkpointing, off.gradient_checkpointing) == (False, False)
