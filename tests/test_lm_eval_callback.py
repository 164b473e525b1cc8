"""LmEvalCallback in a real SFTTrainer run on a tiny LoRA model, offline on kinfolk's sample tasks."""

import random

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from trl import SFTConfig, SFTTrainer

from kinfolk.callbacks.evaluation import LmEvalCallback, preserved_rng
from kinfolk.drift.churn import churn_counts, outcomes, read_samples
from kinfolk.drift.log import read_rows, steps
from kinfolk.errors import InputError
from kinfolk.testing import build_model, prompt_completion_dataset

TASKS = ["kinfolk_csqa_sample", "kinfolk_gsm8k_sample"]


def train(tmp_path, tokenizer, with_callback):
    torch.manual_seed(0)
    base = build_model("llama", tokenizer=tokenizer)
    model = get_peft_model(base, LoraConfig(r=4, lora_dropout=0.3, target_modules=["q_proj", "v_proj"]))
    args = SFTConfig(
        output_dir=str(tmp_path / ("with" if with_callback else "without")),
        max_steps=4,
        per_device_train_batch_size=4,
        learning_rate=5e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        max_length=64,
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=prompt_completion_dataset(16), processing_class=tokenizer
    )
    callback = None
    if with_callback:
        callback = LmEvalCallback(
            trainer,
            TASKS,
            limit=3,
            every_n_steps=2,
            include_defaults=False,
            batch_size=2,
            gen_kwargs="max_gen_toks=6",
        )
        trainer.add_callback(callback)
    trainer.train()
    return model, trainer, callback


def test_scores_churn_and_untouched_training(tmp_path, tiny_tokenizer):
    model, trainer, _ = train(tmp_path, tiny_tokenizer, with_callback=True)
    reference, _, _ = train(tmp_path, tiny_tokenizer, with_callback=False)
    # Dropout draws from the RNG every step: evaluating in between must not change the trajectory.
    for (name, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0, msg=name)

    run = tmp_path / "with"
    rows = steps(read_rows(run))
    assert {2, 4} <= set(rows)
    for step in (2, 4):
        row = rows[step]
        assert 0.0 <= row["lm_eval/kinfolk_csqa_sample/acc"] <= 1.0
        frozen = read_samples(run / "lm_eval" / "frozen" / "samples_kinfolk_csqa_sample.jsonl")
        current = read_samples(run / "lm_eval" / f"step-{step}" / "samples_kinfolk_csqa_sample.jsonl")
        assert len(current) == 3  # the limit
        counts = churn_counts(outcomes(frozen), outcomes(current))
        for kind in "CFGW":
            assert row[f"churn/kinfolk_csqa_sample/{kind}"] == counts[kind]
        acc = sum(record["acc"] for record in current) / len(current)
        assert row["lm_eval/kinfolk_csqa_sample/acc"] == pytest.approx(acc)
        assert "churn/kinfolk_gsm8k_sample/strict-match/C" in row
    logged = [entry for entry in trainer.state.log_history if "lm_eval/kinfolk_csqa_sample/acc" in entry]
    assert [entry["step"] for entry in logged] == [2, 4]
    assert model.training  # the trainer's mode is back after each evaluation


def test_rng_is_restored():
    def draw():
        return torch.rand(2).tolist(), random.random(), float(np.random.rand())

    def seed():
        torch.manual_seed(0), random.seed(0), np.random.seed(0)

    seed()
    expected = draw()
    seed()
    with preserved_rng():
        torch.manual_seed(123), random.seed(1), np.random.seed(2)
        draw()
    assert draw() == expected


def test_refuses_sharded_models(tmp_path, tiny_tokenizer):
    class Sharded:
        is_fsdp_enabled = True

    with pytest.raises(InputError, match=r"^LmEvalCallback is not supported under FSDP: .*`kinfolk eval`"):
        LmEvalCallback(Sharded(), TASKS)
