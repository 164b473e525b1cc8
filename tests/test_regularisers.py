"""Replay and Output-KL as options of WeightedSFTTrainer, against direct computations."""

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from sft_helpers import assert_same_tensors, batch_loss_and_grads, parameters, weighted_data, weighted_trainer

from kinfolk.testing import text_dataset
from kinfolk.tokens import IGNORE_INDEX
from kinfolk.trainers.regularisers import RetainedBatches, replay_mix


def _tokenised(rows: int, offset: int, length: int = 3) -> Dataset:
    return Dataset.from_dict(
        {
            "input_ids": [[offset + row] * length for row in range(rows)],
            "labels": [[offset + row] * length for row in range(rows)],
            "example_weights": [[1.0] * length for _ in range(rows)],
            "token_loss_weights": [[1.0] * length for _ in range(rows)],
        }
    )


@pytest.mark.parametrize(("train_rows", "retained_rows", "ratio", "expected"), [(6, 10, 0.25, 2), (8, 3, 0.5, 8)])
def test_replay_adds_retained_rows_at_the_ratio(train_rows, retained_rows, ratio, expected):
    mixed = replay_mix(_tokenised(train_rows, 0), _tokenised(retained_rows, 100), ratio, seed=0)
    replayed = [ids[0] for ids in mixed["input_ids"] if ids[0] >= 100]
    assert len(mixed) == train_rows + expected and len(replayed) == expected
    counts = [replayed.count(100 + row) for row in range(retained_rows)]
    assert max(counts) - min(counts) <= 1  # a smaller retained set is cycled through evenly
    assert sorted(ids[0] for ids in mixed["input_ids"] if ids[0] < 100) == list(range(train_rows))


def test_replayed_examples_are_trained_at_the_replay_weight(tiny_tokenizer, tmp_path):
    retained = text_dataset(5, seed=3)  # another SFT format than the training data
    trainer = weighted_trainer(
        tiny_tokenizer,
        weighted_data(6, [2.0] * 6),
        tmp_path,
        retained_dataset=retained,
        replay_ratio=0.25,
        replay_weight=0.5,
    )
    rows = trainer.train_dataset
    assert len(rows) == 8
    weights = sorted(row["example_weights"][0] for row in rows)
    assert weights == [0.5, 0.5] + [2.0] * 6
    retained_ids = {tuple(tiny_tokenizer(text + tiny_tokenizer.eos_token)["input_ids"]) for text in retained["text"]}
    assert all(tuple(row["input_ids"]) in retained_ids for row in rows if row["example_weights"][0] == 0.5)
    trainer.train()


def _lora(init_identity: bool) -> LoraConfig:
    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=init_identity)


def test_output_kl_of_an_untrained_adapter_changes_neither_loss_nor_gradients(tiny_tokenizer, tmp_path):
    retained = text_dataset(6, seed=5)
    plain = weighted_trainer(tiny_tokenizer, weighted_data(4), tmp_path / "p", peft_config=_lora(True))
    kl = weighted_trainer(
        tiny_tokenizer,
        weighted_data(4),
        tmp_path / "k",
        peft_config=_lora(True),
        retained_dataset=retained,
        output_kl_coef=3.0,
    )
    loss, grads = batch_loss_and_grads(plain)
    kl_loss, kl_grads = batch_loss_and_grads(kl)
    torch.testing.assert_close(kl_loss, loss, rtol=0, atol=1e-6)
    assert_same_tensors(kl_grads, grads, rel=1e-5)


def _reference_kl(trainer, rows) -> float:
    """KL(frozen‖current) from full logits, mean over the retained rows' trained tokens."""
    model = trainer.model
    total, count = 0.0, 0
    for row in rows:
        ids = torch.tensor([row["input_ids"]])
        scored = torch.tensor(row["labels"][1:]) != IGNORE_INDEX
        with torch.no_grad():
            current = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
            with model.disable_adapter():
                frozen = model(input_ids=ids).logits[0, :-1].log_softmax(-1)
        kl = (frozen.exp() * (frozen - current)).sum(-1)
        total += float(kl[scored].sum())
        count += int(scored.sum())
    return total / count


@pytest.mark.parametrize("layout", [{}, {"padding_free": True, "max_length": None}], ids=["padded", "padding-free"])
def test_output_kl_adds_lambda_times_the_retained_kl(tiny_tokenizer, tmp_path, layout):
    retained = weighted_data(7, seed=9).remove_columns("weight")
    common = {"peft_config": _lora(False), "retained_dataset": retained, "output_kl_batch_size": 3, **layout}
    trainer = weighted_trainer(tiny_tokenizer, weighted_data(4), tmp_path, output_kl_coef=0.7, **common)
    loss, _ = batch_loss_and_grads(trainer)
    output_kl = trainer._output_kl
    trainer._output_kl = None
    sft_loss, _ = batch_loss_and_grads(trainer)
    rows = output_kl.batches.batch(0)  # the first micro-batch of step 0 on rank 0
    assert len(rows) == 3
    expected = _reference_kl(trainer, rows)
    assert expected > 0
    assert float(loss - sft_loss) == pytest.approx(0.7 * expected, rel=1e-4)
    assert trainer._metrics["train"]["output_kl"][-1] == pytest.approx(expected, rel=1e-4)


def test_resuming_with_output_kl_sees_the_same_retained_batches(tiny_tokenizer, tmp_path):
    options = {
        "peft_config": _lora(False),
        "retained_dataset": text_dataset(5, seed=2),
        "output_kl_coef": 1.0,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "max_steps": 3,
        "save_strategy": "steps",
        "save_steps": 1,
    }
    data = weighted_data(8, [0.5, 1, 2, 1, 0.5, 3, 1, 1])
    straight = weighted_trainer(tiny_tokenizer, data, tmp_path, **options)
    straight.train()
    resumed = weighted_trainer(tiny_tokenizer, data, tmp_path, **options)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert_same_tensors(parameters(resumed.model), parameters(straight.model), rel=1e-6)
    assert "output_kl" in straight.state.log_history[0]


def test_retained_batches_cover_each_pass_once_and_are_seeded():
    data = Dataset.from_dict({"x": list(range(7))})
    batches = RetainedBatches(data, batch_size=3, seed=4)
    first_pass = batches.rows(0) + batches.rows(1) + batches.rows(2)[:1]
    assert sorted(first_pass) == list(range(7))
    assert batches.rows(5) == RetainedBatches(data, batch_size=3, seed=4).rows(5)
    assert batches.rows(0) != RetainedBatches(data, batch_size=3, seed=5).rows(0)


def test_regularisers_need_retained_data_and_output_kl_a_peft_model(tiny_tokenizer, tmp_path):
    with pytest.raises(ValueError, match="need retained data"):
        weighted_trainer(tiny_tokenizer, weighted_data(3), tmp_path, replay_ratio=0.2)
    with pytest.raises(ValueError, match="needs a PEFT model"):
        weighted_trainer(
            tiny_tokenizer, weighted_data(3), tmp_path, retained_dataset=text_dataset(3), output_kl_coef=1
        )
