"""WeightedSFTTrainer on a real checkpoint (`make test-real`; needs `make real-models`): SmolLM2-135M-Instruct.

Full fine-tuning in fp32 on conversational prompt/completion rows rendered by SmolLM2's real chat template
(49k vocabulary, tied head): with every weight 1 two optimiser steps (micro-batches of 2, two accumulated per
step) give SFTTrainer's logged losses and metrics and its parameters, bit for bit; with non-uniform weights the
first step's loss is the hand-written Σ W·ℓ / D computed from the untouched model on TRL's own tokenisation.
"""

import math

import pytest
import torch
from sft_helpers import parameters, reference_weighted_loss, sft_trainer, weighted_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer

from kinfolk.testing import conversational_prompt_completion_dataset
from kinfolk.testing.resources import measure
from kinfolk.tokens import IGNORE_INDEX

pytestmark = pytest.mark.real

NAME = "smollm2-135m-instruct"
WEIGHTS = [0.4, 2.5, 0.0, 1.3]
ADAMW = {"learning_rate": 2e-5, "lr_scheduler_type": "constant", "max_length": 128}


def load(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def test_unit_weights_fine_tune_like_sft_trainer(real_model_dir, tmp_path):
    path = real_model_dir(NAME)
    tokenizer = AutoTokenizer.from_pretrained(path)
    data = conversational_prompt_completion_dataset(4, seed=3)
    options = {**ADAMW, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "max_steps": 2}
    runs = {}
    for method in ("weighted", "sft"):
        with measure(f"{method}_sft_two_steps", model=NAME) as usage:
            if method == "weighted":
                trainer = weighted_trainer(
                    tokenizer, data.add_column("weight", [1.0] * 4), tmp_path / method, model=load(path), **options
                )
            else:
                trainer = sft_trainer(tokenizer, data, tmp_path / method, model=load(path), **options)
            trainer.train()
        print(usage.summary())
        runs[method] = (parameters(trainer.model), trainer.state.log_history)
        del trainer
    (ours, our_logs), (theirs, their_logs) = runs["weighted"], runs["sft"]
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert torch.equal(ours[name], theirs[name]), name
    assert len(their_logs) == 3  # two steps and the run's summary
    for mine, reference in zip(our_logs[:2], their_logs[:2]):
        for key in ("loss", "entropy", "mean_token_accuracy", "num_tokens", "grad_norm"):
            assert mine[key] == reference[key], key
    assert our_logs[1]["loss"] != our_logs[0]["loss"]  # the first step moved the model


@pytest.mark.parametrize(("reduction", "prompt_loss_weight"), [("token", 0.0), ("self_normalized", 0.3)])
def test_weighted_first_step_loss_matches_a_hand_written_reference(
    real_model_dir, tmp_path, reduction, prompt_loss_weight
):
    path = real_model_dir(NAME)
    tokenizer = AutoTokenizer.from_pretrained(path)
    data = conversational_prompt_completion_dataset(4, seed=3)
    # TRL's tokenisation and completion boundary, from SFTTrainer's own prepared rows
    reference_rows = [
        {"input_ids": row["input_ids"], "completion_mask": [int(label != IGNORE_INDEX) for label in row["labels"]]}
        for row in sft_trainer(tokenizer, data, tmp_path / "ref", model=load(path), **ADAMW).train_dataset
    ]
    assert max(len(row["input_ids"]) for row in reference_rows) <= 128
    with torch.no_grad():
        expected = reference_weighted_loss(load(path), reference_rows, WEIGHTS, prompt_loss_weight, reduction)
    trainer = weighted_trainer(
        tokenizer, data.add_column("weight", WEIGHTS), tmp_path / "w", model=load(path), **ADAMW,
        per_device_train_batch_size=4, max_steps=1, weight_reduction=reduction, prompt_loss_weight=prompt_loss_weight,
    )  # fmt: skip
    with measure("weighted_sft_one_step", model=NAME, reduction=reduction) as usage:
        trainer.train()
    print(usage.summary())
    logged = trainer.state.log_history[0]
    assert math.isclose(logged["loss"], expected, rel_tol=1e-5)
    assert logged["weight/mean"] == pytest.approx(sum(WEIGHTS) / 4)
