"""WeightedSFTTrainer inside the training loop: gradient accumulation, DDP, resume, packing, eval and logged metrics."""

import sys
from pathlib import Path

import pytest
import torch
from sft_helpers import (
    assert_same_tensors,
    batch_loss_and_grads,
    parameters,
    reference_weighted_loss,
    sft_trainer,
    weighted_data,
    weighted_trainer,
)
from two_process_helpers import accelerate

from kinfolk.testing import build_model, conversational_dataset
from kinfolk.tokens import IGNORE_INDEX
from kinfolk.trainers.weighted_sft_data import WeightColumnError

RANDOM_WEIGHTS = [0.3, 1.7, 0.0, 2.5, 0.8, 1.1, 4.0, 0.6]
SGD = {"optim": "sgd", "learning_rate": 0.5, "weight_decay": 0.0, "lr_scheduler_type": "constant"}


@pytest.mark.parametrize("layout", [{}, {"padding_free": True, "max_length": None}], ids=["padded", "padding-free"])
@pytest.mark.parametrize("reduction", ["token", "sequence", "self_normalized"])
def test_four_micro_batches_give_the_update_of_the_merged_batch(tiny_tokenizer, tmp_path, reduction, layout):
    data = weighted_data(8, RANDOM_WEIGHTS)
    options = {**SGD, **layout, "weight_reduction": reduction, "prompt_loss_weight": 0.2}
    merged = weighted_trainer(tiny_tokenizer, data, tmp_path / "m", per_device_train_batch_size=8, **options)
    merged.train()
    accumulated = weighted_trainer(
        tiny_tokenizer, data, tmp_path / "a", per_device_train_batch_size=2, gradient_accumulation_steps=4, **options
    )
    accumulated.train()
    assert_same_tensors(parameters(accumulated.model), parameters(merged.model), rel=1e-5)
    assert accumulated.state.log_history[0]["loss"] == pytest.approx(merged.state.log_history[0]["loss"], rel=1e-5)


def test_unit_weights_train_like_sft_trainer_over_several_steps(tiny_tokenizer, tmp_path):
    options = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "max_steps": 2}
    ours = weighted_trainer(tiny_tokenizer, weighted_data(8), tmp_path / "w", **options)
    ours.train()
    theirs = sft_trainer(tiny_tokenizer, weighted_data(8).remove_columns("weight"), tmp_path / "s", **options)
    theirs.train()
    assert_same_tensors(parameters(ours.model), parameters(theirs.model))
    steps = [[entry for entry in trainer.state.log_history if "loss" in entry] for trainer in (ours, theirs)]
    assert len(steps[0]) == len(steps[1]) == 2  # one logged entry per step
    for mine, reference in zip(*steps):
        for key in ("loss", "entropy", "mean_token_accuracy", "num_tokens"):
            assert mine[key] == reference[key], key
        # with unit weights the unweighted loss is SFTTrainer's loss
        assert mine["unweighted_loss"] == pytest.approx(reference["loss"], rel=1e-6)


def test_unweighted_loss_is_the_pooled_token_loss_of_each_step(tiny_tokenizer, tmp_path):
    """At learning rate 0 every step sees the same model, and each step is all 8 rows in 4 micro-batches of 2, so
    each logged `unweighted_loss` must be Σ M·ℓ / Σ M over the whole dataset (pooled, not a mean of micro-batch
    means), whatever the example weights, and `loss` the weighted Σ W·M·ℓ / Σ M of the same tokens."""
    options = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "max_steps": 2}
    trainer = weighted_trainer(
        tiny_tokenizer,
        weighted_data(8, RANDOM_WEIGHTS),
        tmp_path,
        learning_rate=0.0,
        prompt_loss_weight=0.2,
        **options,
    )
    trainer.train()
    rows = [
        {"input_ids": row["input_ids"], "completion_mask": [int(w >= 1) for w in row["token_loss_weights"]]}
        for row in trainer.train_dataset
    ]
    model = build_model("llama", tokenizer=tiny_tokenizer)
    unweighted = reference_weighted_loss(model, rows, [1.0] * len(rows), 0.2, "token")
    weights = [row["example_weights"][0] for row in trainer.train_dataset]
    weighted = reference_weighted_loss(model, rows, weights, 0.2, "token")
    logged = [record for record in trainer.state.log_history if "loss" in record]
    assert [record["step"] for record in logged] == [1, 2]
    for record in logged:
        assert record["unweighted_loss"] == pytest.approx(unweighted, rel=1e-5)
        assert record["loss"] == pytest.approx(weighted, rel=1e-5)
    assert abs(weighted - unweighted) > 0.01  # the weights do change the loss


def test_no_weight_statistics_without_a_weight_column(tiny_tokenizer, tmp_path):
    from sft_helpers import config

    from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

    data = weighted_data(4).remove_columns("weight")
    trainer = WeightedSFTTrainer(
        model=build_model("llama", tokenizer=tiny_tokenizer),
        args=config(WeightedSFTConfig, tmp_path, weight_column=None, weight_eval_loss=True),
        train_dataset=data,
        eval_dataset=data,
        processing_class=tiny_tokenizer,
    )
    trainer.train()
    trainer.evaluate()
    train_record, eval_record = trainer.state.log_history[0], trainer.state.log_history[-1]
    assert "unweighted_loss" in train_record and "eval_unweighted_loss" in eval_record
    assert [name for record in trainer.state.log_history for name in record if "weight/" in name] == []


def test_all_zero_weights_are_refused_before_training(tiny_tokenizer, tmp_path):
    with pytest.raises(
        WeightColumnError, match=r"every weight in the train dataset's weight column 'weight' is 0 \(3"
    ):
        weighted_trainer(tiny_tokenizer, weighted_data(3, [0.0, 0.0, 0.0]), tmp_path)
    with pytest.raises(WeightColumnError, match=r"'weight' is 0 after clipping"):
        weighted_trainer(tiny_tokenizer, weighted_data(3, [1.0, 2.0, 0.0]), tmp_path, weight_clip_max=0.0)


def test_logs_weight_statistics_beside_trl_metrics(tiny_tokenizer, tmp_path):
    weights = [0.5, 2.0, 1.0, 4.0]
    trainer = weighted_trainer(tiny_tokenizer, weighted_data(4, weights), tmp_path)
    trainer.train()
    logged = trainer.state.log_history[0]
    assert {"loss", "entropy", "mean_token_accuracy", "num_tokens"} <= logged.keys()
    assert logged["weight/mean"] == pytest.approx(sum(weights) / 4)
    assert (logged["weight/min"], logged["weight/max"]) == (0.5, 4.0)
    assert logged["weight/batch_ess"] == pytest.approx(sum(weights) ** 2 / sum(w * w for w in weights))


def test_resuming_from_a_checkpoint_ends_where_an_uninterrupted_run_ends(tiny_tokenizer, tmp_path):
    data = weighted_data(8, RANDOM_WEIGHTS)
    options = {"per_device_train_batch_size": 2, "max_steps": 4, "save_strategy": "steps", "save_steps": 2}
    straight = weighted_trainer(tiny_tokenizer, data, tmp_path, **options)
    straight.train()
    resumed = weighted_trainer(tiny_tokenizer, data, tmp_path, **options)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed.state.global_step == 4
    assert_same_tensors(parameters(resumed.model), parameters(straight.model), rel=1e-6)


@pytest.mark.parametrize("strategy", ["bfd", "bfd_split", "wrapped"])
def test_packing_keeps_each_examples_weight_on_its_tokens(tiny_tokenizer, tmp_path, strategy):
    data = weighted_data(8, RANDOM_WEIGHTS)
    plain = weighted_trainer(tiny_tokenizer, data, tmp_path / "p", max_length=None).train_dataset
    weight_of = {tuple(row["input_ids"]): row["example_weights"][0] for row in plain}
    assert max(map(len, weight_of)) <= 32  # nothing is cut, so packing only regroups the examples
    packed = weighted_trainer(
        tiny_tokenizer, data, tmp_path / "k", packing=True, packing_strategy=strategy, max_length=32
    ).train_dataset
    assert sorted((t, w) for row in packed for t, w in zip(row["input_ids"], row["example_weights"])) == sorted(
        (t, weight_of[ids]) for ids in weight_of for t in ids
    )
    if strategy == "wrapped":
        return  # wrapped rows record no example boundaries
    for row in packed:
        start = 0
        for length in row["seq_lengths"]:
            segment = tuple(row["input_ids"][start : start + length])
            assert row["example_weights"][start : start + length] == [weight_of[segment]] * length
            start += length


@pytest.mark.parametrize("reduction", ["token", "sequence", "self_normalized"])
def test_packed_padding_free_loss_equals_the_padded_loss(tiny_tokenizer, tmp_path, reduction):
    data = weighted_data(6, RANDOM_WEIGHTS[:6])
    options = {"weight_reduction": reduction, "prompt_loss_weight": 0.3}
    padded = weighted_trainer(tiny_tokenizer, data, tmp_path / "p", **options)
    packed = weighted_trainer(tiny_tokenizer, data, tmp_path / "k", packing=True, max_length=64, **options)
    assert len(packed.train_dataset) < len(padded.train_dataset)
    loss, _ = batch_loss_and_grads(padded)
    packed_loss, _ = batch_loss_and_grads(packed)
    torch.testing.assert_close(packed_loss, loss, rtol=1e-5, atol=0)


def test_assistant_only_loss_weights_the_other_turns_by_the_prompt_weight(tiny_tokenizer, tmp_path):
    data = conversational_dataset(3).add_column("weight", [1.0, 2.0, 0.5])
    plain = weighted_trainer(tiny_tokenizer, data, tmp_path / "p", assistant_only_loss=True).train_dataset
    prompted = weighted_trainer(
        tiny_tokenizer, data, tmp_path / "w", assistant_only_loss=True, prompt_loss_weight=0.25
    ).train_dataset
    for row, plain_row, weight in zip(prompted, plain, [1.0, 2.0, 0.5]):
        assistant = [label != IGNORE_INDEX for label in plain_row["labels"]]
        assert any(assistant) and not all(assistant)
        assert row["labels"] == row["input_ids"]
        assert row["token_loss_weights"] == pytest.approx([1.0 if a else 0.25 for a in assistant])
        assert row["example_weights"] == pytest.approx([weight] * len(assistant))


def test_eval_loss_is_sfts_unless_weighted(tiny_tokenizer, tmp_path):
    from sft_helpers import config
    from trl import SFTConfig, SFTTrainer

    from kinfolk.testing import build_model
    from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

    train, held_out = weighted_data(4), weighted_data(4, [2.0] * 4, seed=1)

    def evaluate(cls, config_cls, eval_dataset, **options):
        trainer = cls(
            model=build_model("llama", tokenizer=tiny_tokenizer),
            args=config(config_cls, tmp_path, per_device_eval_batch_size=4, **options),
            train_dataset=train if cls is WeightedSFTTrainer else train.remove_columns("weight"),
            eval_dataset=eval_dataset,
            processing_class=tiny_tokenizer,
        )
        return trainer.evaluate()

    reference = evaluate(SFTTrainer, SFTConfig, held_out.remove_columns("weight"))["eval_loss"]
    unweighted = evaluate(WeightedSFTTrainer, WeightedSFTConfig, held_out)
    weighted = evaluate(WeightedSFTTrainer, WeightedSFTConfig, held_out, weight_eval_loss=True)
    assert unweighted["eval_loss"] == reference
    assert weighted["eval_loss"] == pytest.approx(2 * reference, rel=1e-6)
    assert weighted["eval_weight/mean"] == 2.0


DDP_JOB = Path(__file__).with_name("weighted_sft_ddp_job.py")
DDP_MODES = ["weights", "output_kl"]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Both modes trained by one 2-process launch (each launch starts two interpreters with the whole stack).

    accelerate 1.15 runs `--cpu --num_processes 2` as a single process unless an MPI hostfile is given;
    `--multi_gpu` on a machine without GPUs starts two torchrun workers that use gloo on the CPU.
    """
    root = tmp_path_factory.mktemp("weighted-sft-ddp")
    accelerate(DDP_JOB, str(root), *DDP_MODES)
    return {mode: torch.load(root / f"{mode}.pt") for mode in DDP_MODES}


@pytest.mark.slow
@pytest.mark.xdist_group("two-processes")  # one 2-process job at a time
@pytest.mark.parametrize("mode", DDP_MODES)
def test_two_cpu_processes_give_the_update_of_one_process(launched, tiny_tokenizer, tmp_path, mode):
    """Two CPU processes (gloo) with 4 rows each give the update of one process with the same 8 rows."""
    sys.path.insert(0, str(DDP_JOB.parent))
    from weighted_sft_ddp_job import train_once

    single = train_once(tiny_tokenizer, tmp_path / "single", mode, processes=1)
    record = launched[mode]
    assert (record["num_processes"], record["backend"]) == (2, "gloo")
    logged = single.state.log_history[0]
    assert record["num_tokens"] == logged["num_tokens"]  # the same 8 rows in all
    # pooled over both ranks' tokens, as one process pools its two micro-batches
    for key in ("loss", "unweighted_loss"):
        assert record[key] == pytest.approx(logged[key], rel=1e-5), key
    assert_same_tensors(record["parameters"], parameters(single.model), rel=1e-5)
