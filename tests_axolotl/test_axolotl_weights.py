"""ATLANTIS weights inside axolotl: the plugin registers from a YAML, the weight column survives axolotl's prompt
strategy, and the loss is axolotl's own with unit weights and WeightedSFTTrainer's with any weights."""

from __future__ import annotations

import re
import tempfile

import pytest
import torch
from axolotl.core.trainers.base import AxolotlTrainer
from axolotl.integrations.base import PluginManager
from axolotl_helpers import (
    alpaca_rows,
    build_trainer,
    config,
    first_batch,
    load_config,
    load_data,
    write_config,
    write_rows,
)

from kinfolk.trainers.weighted_sft_data import LOSS_WEIGHTS, TOKEN_COLUMNS, TOKEN_MASS, WEIGHT_STATS

WEIGHTS = [0.5, 2.0, 1.0, 3.0, 0.0, 1.5, 0.25, 1.0]


@pytest.fixture(scope="module")
def model_dir(tiny_kit):
    return tiny_kit.model_dir("llama")


def weighted_setup(tmp_path, model_dir, weights, **kinfolk):
    data = write_rows(tmp_path / "train.jsonl", alpaca_rows(weights))
    values = config(tmp_path, model_dir, data, kinfolk={"weight_column": "weight", **kinfolk})
    return load_config(write_config(tmp_path, values))


def test_the_plugin_registers_from_a_yaml(tmp_path, model_dir):
    cfg = weighted_setup(tmp_path, model_dir, WEIGHTS, weight_reduction="sequence")
    manager = PluginManager.get_instance()
    assert "kinfolk.integrations.axolotl.KinfolkPlugin" in manager.plugins
    assert manager.supports_adapter("atlas")
    assert cfg.kinfolk["weight_column"] == "weight" and cfg.kinfolk["weight_reduction"] == "sequence"


def test_the_weight_column_survives_the_prompt_strategy(tmp_path, model_dir, tiny_kit):
    meta = load_data(weighted_setup(tmp_path, model_dir, WEIGHTS))
    rows = meta.train_dataset  # axolotl shuffles the rows: each is matched to its source by its question
    tokenizer = tiny_kit.tokenizer()
    assert sorted(rows["weight"]) == sorted(WEIGHTS)  # one tokenised row per source row
    for row in rows:
        index = int(re.search(r"What is (\d+) \+", tokenizer.decode(row["input_ids"])).group(1))
        assert row["weight"] == WEIGHTS[index]
        assert set(row["example_weights"]) == {WEIGHTS[index]}
        trained = [label != -100 for label in row["labels"]]
        assert row["token_loss_weights"] == [1.0 if is_trained else 0.0 for is_trained in trained]


def axolotl_own_loss(trainer, model, batch, num_items_in_batch=None):
    plain = {key: value for key, value in batch.items() if key not in (LOSS_WEIGHTS, TOKEN_MASS, WEIGHT_STATS)}
    return AxolotlTrainer.compute_loss(trainer, model, plain, num_items_in_batch=num_items_in_batch)


def test_unit_weights_give_axolotls_own_loss(tmp_path, model_dir):
    trainer, model, _ = build_trainer(weighted_setup(tmp_path, model_dir, [1.0] * 8))
    model.train()
    batches, count = trainer.get_batch_samples(iter(trainer.get_train_dataloader()), 2, torch.device("cpu"))
    with torch.no_grad():
        for batch in batches:  # per batch, and normalised over the whole optimiser step (gradient accumulation)
            torch.testing.assert_close(trainer.compute_loss(model, batch), axolotl_own_loss(trainer, model, batch))
            torch.testing.assert_close(
                trainer.compute_loss(model, batch, num_items_in_batch=count),
                axolotl_own_loss(trainer, model, batch, count),
            )


@pytest.mark.parametrize("reduction", ["token", "sequence", "self_normalized"])
def test_weights_give_weighted_sft_trainers_loss(tmp_path, model_dir, tiny_kit, reduction):
    from kinfolk.testing import prompt_completion_dataset
    from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

    trainer, model, tokenizer = build_trainer(
        weighted_setup(tmp_path, model_dir, WEIGHTS, weight_reduction=reduction, weight_clip_max=2.5)
    )
    batch = first_batch(trainer)
    assert set(batch[LOSS_WEIGHTS][batch[TOKEN_MASS] > 0].tolist()) - {0.5, 2.0, 1.0, 2.5, 1.5, 0.25} == set()
    reference = WeightedSFTTrainer(
        model=model,
        args=WeightedSFTConfig(
            tempfile.mkdtemp(), use_cpu=True, weight_reduction=reduction, report_to=[], max_steps=1
        ),
        train_dataset=prompt_completion_dataset(4).add_column("weight", [1.0] * 4),
        processing_class=tokenizer,
    )
    model.eval()
    with torch.no_grad():
        ours = trainer.compute_loss(model, batch)
        theirs = reference.compute_loss(model, batch)
    torch.testing.assert_close(ours, theirs)
    # and by hand: Σ w·ℓ / D over the answer tokens, from the model's logits
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.detach()
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), batch["labels"][:, 1:].clamp(min=0), reduction="none"
    )
    weights = batch[LOSS_WEIGHTS][:, 1:]
    mass = batch[TOKEN_MASS][:, 1:]
    rows_trained = (mass.sum(-1) > 0).sum()
    normalizer = {"token": mass.sum(), "sequence": rows_trained, "self_normalized": weights.sum()}[reduction]
    torch.testing.assert_close(ours, (nll * weights).sum() / normalizer, rtol=1e-5, atol=1e-6)


def test_token_columns_reach_the_collator_and_nothing_else_does(tmp_path, model_dir):
    trainer, _, _ = build_trainer(weighted_setup(tmp_path, model_dir, WEIGHTS))
    batch = first_batch(trainer)
    assert {LOSS_WEIGHTS, TOKEN_MASS, WEIGHT_STATS} <= set(batch)
    assert not set(TOKEN_COLUMNS) & set(batch) and "weight" not in batch
