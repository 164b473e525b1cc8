"""`kinfolk eval` on the tiny kit: lm-eval's CLI loads the saved model and its adapter (LoRA now, ATLAS through
`import kinfolk`), runs kinfolk's offline tasks, and its per-sample numbers match an in-process evaluation."""

import os
import subprocess
import sys

import pytest
import torch
from lm_eval_helpers import TASK, cli_samples, in_process, log_likelihoods
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from kinfolk.commands import main


def save_adapter(tiny_kit, tmp_path, config):
    base_dir = tiny_kit.model_dir("llama")
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir), config)
    model.save_pretrained(tmp_path / "adapter")
    return base_dir, tmp_path / "adapter"


def test_eval_verb_loads_a_lora_adapter(tiny_kit, tmp_path):
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    base_dir, adapter_dir = save_adapter(tiny_kit, tmp_path, config)
    status = main(
        [
            "eval",
            "--model",
            "hf",
            "--model_args",
            f"pretrained={base_dir},peft={adapter_dir}",
            "--tasks",
            TASK,
            "--device",
            "cpu",
            "--batch_size",
            "2",
            "--log_samples",
            "--output_path",
            str(tmp_path / "results"),
            "--skip_default_tasks",
        ]
    )
    assert status == 0
    ours = log_likelihoods(cli_samples(tmp_path / "results"))

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    without_adapter = log_likelihoods(in_process(base, tokenizer))
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir)
    expected = log_likelihoods(in_process(adapted, tokenizer))
    assert ours == pytest.approx(expected, rel=1e-5)
    assert ours != pytest.approx(without_adapter, rel=1e-3)  # the adapter was really applied


@pytest.mark.slow
def test_eval_verb_loads_an_atlas_adapter_in_a_fresh_process(tiny_kit, tmp_path):
    """A fresh interpreter: only `kinfolk eval` itself can have registered the ATLAS type before loading."""
    from kinfolk.plugins.atlas import AtlasConfig

    config = AtlasConfig(r=4, residual="plain", target_modules=["o_proj"], init_weights=False)
    base_dir, adapter_dir = save_adapter(tiny_kit, tmp_path, config)
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, "-m", "kinfolk", "eval", "--model", "hf"]
    command += ["--model_args", f"pretrained={base_dir},peft={adapter_dir}", "--tasks", TASK, "--device", "cpu"]
    command += ["--log_samples", "--output_path", str(tmp_path / "results"), "--skip_default_tasks"]
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    ours = log_likelihoods(cli_samples(tmp_path / "results"))
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir)
    assert ours == pytest.approx(log_likelihoods(in_process(adapted, tokenizer)), rel=1e-5)
