"""The measuring callbacks inside real SFT runs with an adapter on one upper layer: measured from that layer by
default, they log the KL and target score of full forwards (computed independently) and leave training as it is."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from retained_kl_helpers import reference_retained_kl, reference_target, sft_config
from trl import SFTTrainer

from kinfolk.callbacks.retained_kl import RetainedKLCallback
from kinfolk.callbacks.target_metric import TargetMetricCallback, validation_nll
from kinfolk.drift.log import read_rows, steps
from kinfolk.testing import build_model, perturbed_copy, prompt_completion_dataset

LAYER = 2


def run(tmp_path, tokenizer, architecture, from_layer: bool):
    base = build_model(architecture, "large", tokenizer=tokenizer)
    frozen = perturbed_copy(base, scale=0.0)
    lora = LoraConfig(r=4, target_modules=["o_proj", "down_proj"], layers_to_transform=[LAYER, LAYER + 1])
    torch.manual_seed(0)  # LoRA's A matrices are drawn from the global generator
    model = get_peft_model(base, lora)
    retained, validation = prompt_completion_dataset(6, seed=7), prompt_completion_dataset(5, seed=9)
    args = sft_config(tmp_path / str(from_layer), gradient_accumulation_steps=2, per_device_train_batch_size=2)
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=prompt_completion_dataset(16), processing_class=tokenizer
    )
    measure = validation_nll(validation, tokenizer, batch_size=2)
    measured = {"every_n_steps": 1, "measure_from_layer": from_layer}
    trainer.add_callback(RetainedKLCallback(trainer, retained, batch_size=4, measure_at_start=True, **measured))
    trainer.add_callback(TargetMetricCallback(trainer, measure, **measured))
    trainer.train()
    return model, frozen, retained, validation, steps(read_rows(args.output_dir))


@pytest.mark.parametrize("architecture", ["llama", "gemma2"])
def test_measured_from_the_layer_the_logs_are_the_full_forwards_and_training_is_unchanged(
    tmp_path, tiny_tokenizer, architecture
):
    model, frozen, retained, validation, rows = run(tmp_path, tiny_tokenizer, architecture, from_layer=True)
    full_model, _, _, _, full_rows = run(tmp_path, tiny_tokenizer, architecture, from_layer=False)
    trained = {name: tensor for name, tensor in model.state_dict().items() if "lora_" in name}
    assert trained and all(torch.equal(tensor, full_model.state_dict()[name]) for name, tensor in trained.items())
    assert sorted(rows) == [0, 1, 2, 3]
    assert {row["from_layer"] for row in rows.values()} == {LAYER}
    assert {row["from_layer"] for row in full_rows.values()} == {None}
    expected_kl = reference_retained_kl(frozen, model, tiny_tokenizer, retained)
    assert expected_kl > 1e-4  # training moved the model
    assert rows[3]["retained_kl"] == pytest.approx(expected_kl, rel=1e-4)
    assert rows[3]["target"] == pytest.approx(reference_target(model, tiny_tokenizer, validation), rel=1e-5)
    # both runs trained the same weights (measuring changes nothing), so every logged number agrees step by step
    for step in rows:
        for key in ("retained_kl", "target"):
            assert rows[step][key] == pytest.approx(full_rows[step][key], rel=1e-5, abs=1e-9)
