"""ATLAS on a real checkpoint (`make test-real`; needs `make real-models`): SmolLM2-135M-Instruct.

The atlas is fitted on retained text (Shakespeare's Sonnets) at a middle layer (15 of 30), the adapter trains a
few steps on code (HumanEval prompts and solutions), and retained KL on held-out sonnets is tracked at every
step beside LoRA at the same placement, rank and steps. One seed and three steps: the figures printed here are
a realism check of the machinery, not evidence that ATLAS drifts less. The trained adapter must then load with
`PeftModel.from_pretrained` and through `kinfolk eval` (lm-eval's CLI) and give the trained model's numbers.
"""

import gzip
import json

import pytest
import torch
from datasets import Dataset
from lm_eval_helpers import TASK, cli_samples, in_process, log_likelihoods
from peft import PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from kinfolk.callbacks.retained_kl import RetainedKLCallback
from kinfolk.commands import main
from kinfolk.drift.log import read_rows, steps
from kinfolk.plugins.atlas import AtlasConfig, fit_atlas
from kinfolk.plugins.atlas_comparators import matching_lora_config
from kinfolk.testing.resources import measure
from tools.real_models import humaneval_data_path, shakespeare_sonnets

pytestmark = pytest.mark.real

NAME = "smollm2-135m-instruct"
LAYER = 15
STEPS = 3
ATLAS = AtlasConfig(layers_to_transform=[LAYER], r=8, residual="atlas", num_regions=8, num_directions=4)


def code_dataset(rows=6):
    with gzip.open(humaneval_data_path(), "rt") as handle:
        problems = [json.loads(line) for _, line in zip(range(rows), handle)]
    return Dataset.from_dict(
        {"prompt": [p["prompt"] for p in problems], "completion": [p["canonical_solution"] for p in problems]}
    )


@pytest.fixture(scope="module")
def trained(real_model_dir, tmp_path_factory):
    """Each method trained once: {method: (model, adapter directory, {step: retained KL})}."""
    path = real_model_dir(NAME)
    tokenizer = AutoTokenizer.from_pretrained(path)
    sonnets = shakespeare_sonnets()
    fit_text, held_out = Dataset.from_dict({"text": sonnets[:24]}), Dataset.from_dict({"text": sonnets[24:32]})
    code = code_dataset()
    results = {}
    for method in ("atlas", "lora"):
        out = tmp_path_factory.mktemp(method)
        base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        torch.manual_seed(0)
        if method == "atlas":
            model = get_peft_model(base, ATLAS)
            with measure("atlas_fit", model=NAME):
                fit_atlas(model, fit_text, tokenizer, batch_size=8, max_length=256, progress=False)
        else:
            model = get_peft_model(base, matching_lora_config(base, ATLAS))
        args = SFTConfig(
            output_dir=str(out / "run"), max_steps=STEPS, per_device_train_batch_size=2, learning_rate=5e-3,
            max_length=256, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False, seed=0,
        )  # fmt: skip
        trainer = SFTTrainer(model=model, args=args, train_dataset=code, processing_class=tokenizer)
        trainer.add_callback(
            # hidden-state cache: exact down to 0 (the expectation cache's fp32 floor is ~1e-6 on real models)
            RetainedKLCallback(
                trainer, held_out, positions="all", every_n_steps=1, measure_at_start=True, cache="hidden"
            )
        )
        with measure(f"{method}_train", model=NAME, steps=STEPS) as usage:
            trainer.train()
        kl = {step: row["retained_kl"] for step, row in steps(read_rows(out / "run")).items()}
        print(f"{method}: retained KL by step {kl}; {usage.summary()}")
        model.save_pretrained(out / "adapter")
        results[method] = (model.eval(), out / "adapter", kl)
    return path, tokenizer, results


def test_atlas_and_lora_drift_is_tracked_step_by_step(trained):
    _, _, results = trained
    for method, (_, _, kl) in results.items():
        assert sorted(kl) == list(range(STEPS + 1)), method
        assert kl[0] == pytest.approx(0.0, abs=1e-9), method  # both adapters start as the identity
        assert kl[STEPS] > kl[1] > 0, method  # training moves the retained distribution, step by step (ATLAS ~1e-7)
    print({method: kl[STEPS] for method, (_, _, kl) in results.items()})


def test_trained_atlas_loads_with_peft_and_through_lm_eval(trained, tmp_path):
    path, tokenizer, results = trained
    model, adapter, _ = results["atlas"]
    assert json.loads((adapter / "adapter_config.json").read_text())["peft_type"] == "ATLAS"
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), adapter).eval()
    ids = tokenizer("def fib(n):\n", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
        with model.disable_adapter():
            frozen = model(input_ids=ids).logits
        assert (loaded(input_ids=ids).logits - frozen).abs().max() > 1e-4  # the trained residual is there

    status = main(
        ["eval", "--model", "hf", "--model_args", f"pretrained={path},peft={adapter},dtype=float32",
         "--tasks", TASK, "--device", "cpu", "--batch_size", "2", "--log_samples",
         "--output_path", str(tmp_path / "results"), "--skip_default_tasks"]
    )  # fmt: skip
    assert status == 0
    ours = log_likelihoods(cli_samples(tmp_path / "results"))
    assert ours == pytest.approx(log_likelihoods(in_process(model, tokenizer)), rel=1e-5)
