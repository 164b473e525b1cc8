"""The lab's numbers are functions of the saved weights: fp32 training, one-thread decoding, no autocast wrapper."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from kinfolk.lab.world.evaluate import generate_responses
from kinfolk.lab.world.training import lab_trainer, save_model
from kinfolk.testing import prompt_completion_dataset


def _trained(tiny_kit, tmp_path, **overrides):
    model = AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama"))
    data = prompt_completion_dataset(8, seed=1)
    trainer = lab_trainer(model, data, tiny_kit.tokenizer(), tmp_path / "run", 2, 1e-3, batch_size=4, **overrides)
    trainer.train()
    return trainer


def test_a_trained_lab_model_in_memory_gives_the_logits_of_its_saved_weights(tiny_kit, tmp_path):
    trainer = _trained(tiny_kit, tmp_path, progress=False)
    assert trainer.accelerator.mixed_precision == "no"  # TRL's default bf16=True would autocast on the CPU
    saved = save_model(trainer.model, tiny_kit.tokenizer(), tmp_path / "saved")
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with torch.inference_mode():
        in_memory = trainer.model(ids).logits
        reloaded = AutoModelForCausalLM.from_pretrained(saved)(ids).logits
    assert torch.equal(in_memory, reloaded)


def test_scoring_refuses_a_model_left_wrapped_in_autocast(tiny_kit, tmp_path):
    trainer = _trained(tiny_kit, tmp_path, progress=False, bf16=True)  # what the lab did up to LAB_VERSION 3
    with pytest.raises(ValueError, match="wrapped for mixed precision"):
        generate_responses(trainer.model, tiny_kit.tokenizer(), ["ab"])


def test_decoding_runs_on_one_thread_whatever_the_caller_set(tiny_kit, monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama"))
    seen, generate = [], model.generate

    def recording_generate(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", recording_generate)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        generate_responses(model, tiny_kit.tokenizer(), ["ab", "abc"], batch_size=1)
        assert torch.get_num_threads() == 2  # the caller's setting is restored
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 1]
