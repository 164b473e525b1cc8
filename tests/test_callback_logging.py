"""Measuring callbacks keep the trainer's own log records: loss, grad_norm and learning rate at every logged step.

transformers' callback handler clears `should_log` whenever anything logs; a callback that logged from `on_step_end`
used to delete the trainer's record of every step it measured. Here both callbacks measure at every step with
`logging_steps=1`, with and without gradient accumulation, and each step must have one record holding the trainer's
metrics and the callback's.
"""

import pytest
from peft import LoraConfig, get_peft_model
from retained_kl_helpers import sft_config
from trl import SFTTrainer

from kinfolk.callbacks import LmEvalCallback, RetainedKLCallback
from kinfolk.testing import build_model, prompt_completion_dataset

STEPS = 3
TRAINER_METRICS = ("loss", "grad_norm", "learning_rate")


def retained_kl(trainer):
    return RetainedKLCallback(trainer, prompt_completion_dataset(4, seed=5), every_n_steps=1, batch_size=4)


def lm_eval(trainer):
    return LmEvalCallback(
        trainer,
        ["kinfolk_csqa_sample"],
        limit=2,
        every_n_steps=1,
        churn=False,
        include_defaults=False,
        batch_size=2,
    )


@pytest.mark.parametrize("accumulation", [1, 2])
@pytest.mark.parametrize(("make_callback", "metric"), [(retained_kl, "retained_kl"), (lm_eval, "lm_eval/")])
def test_every_step_record_has_the_trainers_metrics_and_the_callbacks(
    tmp_path, tiny_tokenizer, make_callback, metric, accumulation
):
    model = get_peft_model(build_model("llama", tokenizer=tiny_tokenizer), LoraConfig(r=4, target_modules=["q_proj"]))
    args = sft_config(
        tmp_path, max_steps=STEPS, per_device_train_batch_size=2, gradient_accumulation_steps=accumulation
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=prompt_completion_dataset(12), processing_class=tiny_tokenizer
    )
    trainer.add_callback(make_callback(trainer))
    trainer.train()

    step_records = [record for record in trainer.state.log_history if any(name.startswith(metric) for name in record)]
    assert [record["step"] for record in step_records] == list(range(1, STEPS + 1))
    for record in step_records:
        missing = [name for name in TRAINER_METRICS if name not in record]
        assert not missing, f"step {record['step']} lost the trainer's {missing}: {record}"
    # The trainer's own records are the same ones, one per step (none left without the callback's metrics).
    assert [record["step"] for record in trainer.state.log_history if "loss" in record] == list(range(1, STEPS + 1))
