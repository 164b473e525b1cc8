"""Four LoRA SFT steps with LmEvalCallback every 2 steps; run under two processes by tests/test_lm_eval_ddp.py.

    python -m accelerate.commands.launch --multi_gpu --num_processes 2 lm_eval_ddp_job.py RUN_DIR

`train(run_dir, processes)` is also the one-process reference: the same 4 rows per step, as 2 micro-batches of 2.
"""

from __future__ import annotations

import sys

import torch
from peft import LoraConfig, get_peft_model
from trl import SFTConfig, SFTTrainer

from kinfolk.callbacks.evaluation import LmEvalCallback
from kinfolk.process_group import end_training
from kinfolk.testing import build_model, build_tokenizer, prompt_completion_dataset

TASKS = ["kinfolk_csqa_sample", "kinfolk_gsm8k_sample"]


def train(run_dir: str, processes: int) -> SFTTrainer:
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = get_peft_model(
        build_model("llama", tokenizer=tokenizer), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    args = SFTConfig(
        output_dir=run_dir, max_steps=4, per_device_train_batch_size=2, gradient_accumulation_steps=2 // processes,
        learning_rate=5e-2, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False, seed=0,
        max_length=64, disable_tqdm=True,
    )  # fmt: skip
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=prompt_completion_dataset(16), processing_class=tokenizer
    )
    callback = LmEvalCallback(
        trainer, TASKS, limit=3, every_n_steps=2, include_defaults=False, batch_size=2, gen_kwargs="max_gen_toks=6"
    )
    trainer.add_callback(callback)
    trainer.train()
    return trainer


if __name__ == "__main__":
    trainer = train(sys.argv[1], processes=2)
    trainer.accelerator.wait_for_everyone()
    end_training(trainer)  # every rank waits, then gloo is torn down (kinfolk.process_group)
