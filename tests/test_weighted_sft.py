"""WeightedSFTTrainer's loss against SFTTrainer and against a hand-written reference, one batch at a time."""

import math

import pytest
import torch
from sft_helpers import (
    IDENTITY_REL,
    assert_same_loss,
    assert_same_tensors,
    batch_loss_and_grads,
    config,
    reference_weighted_loss,
    sft_trainer,
    weighted_data,
    weighted_trainer,
)

from kinfolk.testing import build_model, conversational_dataset, text_dataset
from kinfolk.tokens import IGNORE_INDEX
from kinfolk.trainers.weighted_sft_data import WeightColumnError, WeightTransform

LAYOUTS = {"padded": {}, "padding-free": {"padding_free": True, "max_length": None}}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_unit_weights_reproduce_sft_loss_and_gradients_exactly(tiny_tokenizer, tmp_path, layout):
    data = weighted_data(6)
    ours = weighted_trainer(tiny_tokenizer, data, tmp_path / "w", **LAYOUTS[layout])
    theirs = sft_trainer(tiny_tokenizer, data.remove_columns("weight"), tmp_path / "s", **LAYOUTS[layout])
    for num_items in (None, torch.tensor(17)):  # within the batch, and with a step-wide token count
        if num_items is not None:  # as in training: the step's micro-batches hold 17 scored tokens in all
            ours._step_normalizer = num_items.float()
        loss, grads = batch_loss_and_grads(ours, num_items_in_batch=num_items)
        expected_loss, expected_grads = batch_loss_and_grads(theirs, num_items_in_batch=num_items)
        assert_same_loss(loss, expected_loss)
        assert_same_tensors(grads, expected_grads, rel=IDENTITY_REL)


@pytest.mark.parametrize(
    ("kind", "options"),
    [
        ("full sequence (prompt_loss_weight=1)", {}),
        ("assistant-only", {"assistant_only_loss": True}),
        ("language modeling", {}),
    ],
)
def test_unit_weights_reproduce_sft_in_other_loss_modes(tiny_tokenizer, tmp_path, kind, options):
    if kind.startswith("full"):
        data, ours_options, theirs_options = (
            weighted_data(6),
            {"prompt_loss_weight": 1.0},
            {"completion_only_loss": False},
        )
    elif kind == "assistant-only":
        data, ours_options, theirs_options = conversational_dataset(6), options, options
    else:
        data, ours_options, theirs_options = text_dataset(6), {}, {}
    ours = weighted_trainer(tiny_tokenizer, data, tmp_path / "w", weight_column=None, **ours_options)
    theirs = sft_trainer(
        tiny_tokenizer,
        data.remove_columns([c for c in data.column_names if c == "weight"]),
        tmp_path / "s",
        **theirs_options,
    )
    loss, grads = batch_loss_and_grads(ours)
    expected_loss, expected_grads = batch_loss_and_grads(theirs)
    assert_same_loss(loss, expected_loss)
    assert_same_tensors(grads, expected_grads, rel=IDENTITY_REL)


def test_weights_of_two_double_the_token_loss_and_its_gradients(tiny_tokenizer, tmp_path):
    one = weighted_trainer(tiny_tokenizer, weighted_data(6), tmp_path / "one")
    two = weighted_trainer(tiny_tokenizer, weighted_data(6, [2.0] * 6), tmp_path / "two")
    loss, grads = batch_loss_and_grads(one)
    doubled_loss, doubled_grads = batch_loss_and_grads(two)
    assert torch.equal(doubled_loss, 2 * loss)
    assert_same_tensors(doubled_grads, grads, scale=2.0)


@pytest.mark.parametrize("reduction", ["token", "sequence", "self_normalized"])
def test_an_example_of_weight_zero_contributes_no_gradient(tiny_tokenizer, tmp_path, reduction):
    # Replacing the zero-weight example's answer by another of the same token length changes nothing.
    data = weighted_data(4, [1.0, 0.0, 2.0, 0.5])
    ours = weighted_trainer(tiny_tokenizer, data, tmp_path / "a", weight_reduction=reduction)
    loss, grads = batch_loss_and_grads(ours)
    row = dict(ours.train_dataset[1])
    answer = [i for i, label in enumerate(row["labels"]) if label != IGNORE_INDEX]
    row["input_ids"] = list(row["input_ids"])
    for position in answer:
        row["input_ids"][position] = (row["input_ids"][position] + 7) % len(tiny_tokenizer)
    row["labels"] = [row["input_ids"][i] if i in answer else IGNORE_INDEX for i in range(len(row["labels"]))]
    rows = [ours.train_dataset[0], row, ours.train_dataset[2], ours.train_dataset[3]]
    inputs = ours._prepare_inputs(ours.data_collator(rows))
    ours.model.zero_grad(set_to_none=True)
    ours.compute_loss(ours.model, inputs).backward()
    assert_same_tensors({n: p.grad for n, p in ours.model.named_parameters()}, grads)
    assert loss > 0


@pytest.mark.parametrize("reduction", ["token", "sequence"])
def test_a_single_example_gradient_scales_with_its_weight(tiny_tokenizer, tmp_path, reduction):
    unweighted = weighted_trainer(tiny_tokenizer, weighted_data(1), tmp_path / "u", weight_reduction=reduction)
    weighted = weighted_trainer(tiny_tokenizer, weighted_data(1, [3.5]), tmp_path / "w", weight_reduction=reduction)
    loss, grads = batch_loss_and_grads(unweighted)
    weighted_loss, weighted_grads = batch_loss_and_grads(weighted)
    torch.testing.assert_close(weighted_loss, 3.5 * loss)
    assert_same_tensors(weighted_grads, grads, scale=3.5, rel=1e-5)


@pytest.mark.parametrize("prompt_loss_weight", [0.0, 0.3])
@pytest.mark.parametrize("reduction", ["token", "sequence", "self_normalized"])
def test_reductions_match_a_hand_written_reference(tiny_tokenizer, tmp_path, reduction, prompt_loss_weight):
    weights = [0.2, 1.7, 0.0, 3.0, 0.9]
    data = weighted_data(5, weights)
    trainer = weighted_trainer(
        tiny_tokenizer, data, tmp_path, weight_reduction=reduction, prompt_loss_weight=prompt_loss_weight
    )
    loss, _ = batch_loss_and_grads(trainer)
    # The reference tokenises with SFTTrainer's full-sequence labels and its completion boundary
    reference_rows = [
        {"input_ids": row["input_ids"], "completion_mask": [int(w >= 1) for w in row["token_loss_weights"]]}
        for row in weighted_trainer(
            tiny_tokenizer, data, tmp_path / "ref", weight_column=None, prompt_loss_weight=1e-3
        ).train_dataset
    ]
    expected = reference_weighted_loss(
        build_model("llama", tokenizer=tiny_tokenizer), reference_rows, weights, prompt_loss_weight, reduction
    )
    assert math.isclose(float(loss), expected, rel_tol=1e-5)


def test_prompt_tokens_get_labels_only_with_a_prompt_loss_weight(tiny_tokenizer, tmp_path):
    data = weighted_data(3)
    plain = weighted_trainer(tiny_tokenizer, data, tmp_path / "p").train_dataset[0]
    weighted = weighted_trainer(tiny_tokenizer, data, tmp_path / "w", prompt_loss_weight=0.1).train_dataset[0]
    prompt = [i for i, label in enumerate(plain["labels"]) if label == IGNORE_INDEX]
    assert prompt and weighted["labels"] == weighted["input_ids"]
    assert [weighted["token_loss_weights"][i] for i in prompt] == pytest.approx([0.1] * len(prompt))
    assert all(w == 1.0 for i, w in enumerate(weighted["token_loss_weights"]) if i not in prompt)


def test_weight_transform_clips_then_normalises_to_mean_one():
    from datasets import Dataset

    data = Dataset.from_dict({"weight": [0.0, 1.0, 2.0, 10.0]})
    transform = WeightTransform.fit(data, "weight", clip_min=0.5, clip_max=4.0, normalize=True)
    values = [transform(w, row) for row, w in enumerate(data["weight"])]
    assert values == pytest.approx([0.5 / 1.875, 1 / 1.875, 2 / 1.875, 4 / 1.875])
    assert sum(values) / len(values) == pytest.approx(1.0)


def test_missing_weight_column_names_it_and_the_columns_present(tiny_tokenizer, tmp_path):
    with pytest.raises(WeightColumnError, match=r"no weight column 'score'.*\['completion', 'prompt', 'weight'\]"):
        weighted_trainer(tiny_tokenizer, weighted_data(3), tmp_path, weight_column="score")


def test_invalid_weights_are_reported_with_their_rows(tiny_tokenizer, tmp_path):
    data = weighted_data(5, [1.0, float("nan"), 2.0, -1.0, float("inf")])
    with pytest.raises(WeightColumnError, match=r"3 invalid value\(s\).*rows 1 \(nan\), 3 \(-1.0\), 4 \(inf\)"):
        weighted_trainer(tiny_tokenizer, data, tmp_path)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"label_smoothing_factor": 0.1}, "label_smoothing_factor"),
        ({"loss_type": "dft"}, "dft"),
        ({"dataset_kwargs": {"skip_prepare_dataset": True}}, "skip_prepare_dataset"),
        ({"weight_reduction": "sequence", "packing": True, "packing_strategy": "wrapped"}, "wrapped"),
    ],
)
def test_options_it_cannot_honour_are_refused(tiny_tokenizer, tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        weighted_trainer(tiny_tokenizer, weighted_data(3), tmp_path, **options)


def test_a_compute_loss_func_is_refused(tiny_tokenizer, tmp_path):
    from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

    with pytest.raises(ValueError, match="compute_loss_func"):
        WeightedSFTTrainer(
            model=build_model("llama", tokenizer=tiny_tokenizer),
            args=config(WeightedSFTConfig, tmp_path),
            train_dataset=weighted_data(3),
            processing_class=tiny_tokenizer,
            compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.logits.sum(),
        )


def test_config_rejects_bad_weight_options(tmp_path):
    from kinfolk.trainers import WeightedSFTConfig

    for options, message in [
        ({"weight_reduction": "mean"}, "weight_reduction"),
        ({"prompt_loss_weight": 1.5}, r"\[0, 1\]"),
        ({"weight_clip_min": 2.0, "weight_clip_max": 1.0}, "larger than"),
    ]:
        with pytest.raises(ValueError, match=message):
            WeightedSFTConfig(output_dir=str(tmp_path), use_cpu=True, **options)


def test_a_streamed_dataset_trains_and_reports_a_bad_weight_by_row(tiny_tokenizer, tmp_path):
    streamed = weighted_data(4, [0.5, 2.0, 1.0, 1.0]).to_iterable_dataset()
    trainer = weighted_trainer(tiny_tokenizer, streamed, tmp_path / "ok", per_device_train_batch_size=2)
    trainer.train()
    assert trainer.state.log_history[0]["weight/mean"] == 1.25  # the first two rows
    bad = weighted_data(4, [1.0, 1.0, float("nan"), 1.0]).to_iterable_dataset()
    trainer = weighted_trainer(tiny_tokenizer, bad, tmp_path / "bad", per_device_train_batch_size=2, max_steps=2)
    with pytest.raises(WeightColumnError, match="row 2 holds nan"):
        trainer.train()


def test_an_sft_config_is_upgraded_with_the_weight_options_at_their_defaults(tiny_tokenizer, tmp_path):
    from trl import SFTConfig

    from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

    trainer = WeightedSFTTrainer(
        model=build_model("llama", tokenizer=tiny_tokenizer),
        args=config(SFTConfig, tmp_path, eos_token="<|im_end|>", per_device_train_batch_size=3),
        train_dataset=weighted_data(3),
        processing_class=tiny_tokenizer,
    )
    assert isinstance(trainer.args, WeightedSFTConfig)
    assert (trainer.args.eos_token, trainer.args.per_device_train_batch_size) == ("<|im_end|>", 3)
    assert (trainer.args.weight_column, trainer.args.weight_reduction) == ("weight", "token")


def test_an_adapters_initial_weights_follow_the_seed_whatever_was_drawn_before(tiny_tokenizer, tmp_path):
    """TRL 1.14 wrapped the model with PEFT before seeding; the trainer seeds first on every TRL of the window."""
    from peft import LoraConfig

    initial = []
    for drawn_before in (1, 1000):
        torch.rand(drawn_before)  # the process's RNG at another state each time
        trainer = weighted_trainer(tiny_tokenizer, weighted_data(), tmp_path / str(drawn_before), seed=3,
                                   peft_config=LoraConfig(r=4, target_modules=["q_proj"]))  # fmt: skip
        initial.append({name: p.detach().clone() for name, p in trainer.model.named_parameters() if "lora_A" in name})
    assert initial[0].keys() == initial[1].keys() and initial[0]
    assert_same_tensors(initial[0], initial[1])
