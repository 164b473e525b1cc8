"""RetainedKLCallback inside real SFTTrainer runs, checked against a full-softmax KL computed independently."""

import pytest
from peft import LoraConfig, get_peft_model
from retained_kl_helpers import reference_retained_kl, sft_config
from trl import SFTTrainer

from kinfolk.callbacks.retained_kl import RetainedKLCallback, retained_batches
from kinfolk.drift.log import read_rows, steps
from kinfolk.testing import build_model, perturbed_copy, prompt_completion_dataset
from kinfolk.tokens import sft_tokenize


@pytest.mark.parametrize("cache", ["auto", "hidden", "none", "log_probs"])
def test_lora_run_logs_the_reference_kl(tmp_path, tiny_tokenizer, cache):
    base = build_model("llama", tokenizer=tiny_tokenizer)
    frozen = perturbed_copy(base, scale=0.0)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    retained = prompt_completion_dataset(6, seed=7)
    trainer = SFTTrainer(
        model=model,
        args=sft_config(tmp_path),
        train_dataset=prompt_completion_dataset(16),
        processing_class=tiny_tokenizer,
    )
    callback = RetainedKLCallback(trainer, retained, every_n_steps=1, batch_size=4, cache=cache, measure_at_start=True)
    trainer.add_callback(callback)
    trainer.train()

    rows = steps(read_rows(tmp_path / "run"))
    assert sorted(rows) == [0, 1, 2, 3]
    assert rows[0]["retained_kl"] == pytest.approx(0.0, abs=1e-7)  # LoRA starts as the identity
    expected = reference_retained_kl(frozen, model, tiny_tokenizer, retained)
    assert expected > 1e-4  # training really moved the model
    assert rows[3]["retained_kl"] == pytest.approx(expected, rel=1e-4)
    assert rows[3]["retained_kl_tokens"] == sum(
        sum(label != -100 for label in labels[1:]) for labels in sft_tokenize(retained, tiny_tokenizer)["labels"]
    )
    assert rows[3]["frozen"] == "disabled adapter"
    assert rows[3]["cache"] == ("expectation" if cache == "auto" else cache)
    logged = [entry for entry in trainer.state.log_history if "retained_kl" in entry]
    assert [entry["step"] for entry in logged] == [0, 1, 2, 3]
    model.train()
    assert callback.measure()["retained_kl"] == pytest.approx(expected, rel=1e-4)
    assert model.training  # measuring switches to eval mode and back


def test_full_fine_tuning_measures_against_the_start_and_survives_resume(tmp_path, tiny_tokenizer):
    retained = prompt_completion_dataset(5, seed=3)

    def run(max_steps, resume):
        model = build_model("qwen2", tokenizer=tiny_tokenizer)  # tied head: the head moves during training
        args = sft_config(tmp_path, max_steps=max_steps, save_strategy="steps", save_steps=2, learning_rate=1e-2)
        trainer = SFTTrainer(
            model=model, args=args, train_dataset=prompt_completion_dataset(16), processing_class=tiny_tokenizer
        )
        trainer.add_callback(RetainedKLCallback(trainer, retained, every_n_steps=2, positions="all"))
        trainer.train(resume_from_checkpoint=resume)
        return model

    run(2, None)
    model = run(4, True)
    rows = steps(read_rows(tmp_path / "run"))
    assert rows[2]["checkpoint"] == "checkpoint-2"
    start = build_model("qwen2", tokenizer=tiny_tokenizer)
    expected = reference_retained_kl(start, model, tiny_tokenizer, retained, positions="all")
    assert expected > 1e-4
    assert rows[4]["retained_kl"] == pytest.approx(expected, rel=1e-4)
    assert rows[4]["frozen"] == "model at train start"
    assert (tmp_path / "run" / "retained_kl_frozen.safetensors").is_file()


def test_retained_batches_validate_their_input(tiny_tokenizer):
    with pytest.raises(ValueError, match="positions"):
        retained_batches(prompt_completion_dataset(2), tiny_tokenizer, positions="prompt")
    tokenized = prompt_completion_dataset(2).map(lambda row: {"input_ids": [1, 2, 3]})
    with pytest.raises(ValueError, match="needs `labels`"):
        retained_batches(tokenized.remove_columns(["prompt", "completion"]), tiny_tokenizer)
    batches = retained_batches(tokenized, tiny_tokenizer, positions="all", batch_size=1)
    assert len(batches) == 2 and batches[0]["input_ids"].tolist() == [[1, 2, 3]]


def test_evaluate_before_train_measures_against_the_frozen_model(tmp_path, tiny_tokenizer):
    # trainer.evaluate() before train() reaches on_evaluate before on_train_begin has built the frozen side.
    base = build_model("llama", tokenizer=tiny_tokenizer)
    frozen = perturbed_copy(base, scale=0.0)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
    retained = prompt_completion_dataset(4, seed=2)
    trainer = SFTTrainer(
        model=model,
        args=sft_config(tmp_path),
        train_dataset=prompt_completion_dataset(8),
        eval_dataset=prompt_completion_dataset(4, seed=9),
        processing_class=tiny_tokenizer,
    )
    trainer.add_callback(RetainedKLCallback(trainer, retained, batch_size=2))
    trainer.evaluate()

    rows = steps(read_rows(tmp_path / "run"))
    expected = reference_retained_kl(frozen, model, tiny_tokenizer, retained)
    assert expected > 1e-4  # the random LoRA already moves the model
    assert rows[0]["retained_kl"] == pytest.approx(expected, rel=1e-4)
    assert rows[0]["frozen"] == "disabled adapter"


def test_the_nll_beside_the_kl_is_the_full_softmax_nll_of_the_same_tokens(tmp_path, tiny_tokenizer):
    import torch

    base = build_model("llama", tokenizer=tiny_tokenizer)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False))
    retained = prompt_completion_dataset(5, seed=3)
    trainer = SFTTrainer(model=model, args=sft_config(tmp_path), train_dataset=prompt_completion_dataset(8),
                         processing_class=tiny_tokenizer)  # fmt: skip
    callback = RetainedKLCallback(trainer, retained, batch_size=2, nll_name="retained_nll")
    measured = callback.measure()

    total = tokens = 0.0
    model.eval()
    with torch.no_grad():
        for ids, labels in zip(*(sft_tokenize(retained, tiny_tokenizer)[k] for k in ("input_ids", "labels"))):
            log_probs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].double(), -1)
            for position, label in enumerate(labels[1:]):
                if label != -100:
                    total -= float(log_probs[position, label])
                    tokens += 1
    assert measured["retained_nll"] == pytest.approx(total / tokens, rel=1e-5)
    assert measured["retained_kl_tokens"] == tokens
