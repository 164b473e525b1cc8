"""Two SFT steps of a LoRA model with RetainedKLCallback (and TargetMetricCallback's validation NLL of the same
rows), once per frozen-side cache; run under `accelerate launch`.

`python -m accelerate.commands.launch --multi_gpu --num_processes 2 retained_kl_ddp_job.py RUN_DIR CACHE [CACHE ...]`
measures at the start and after each step with each given cache in turn (one launch for all: a launch costs two
interpreters with the whole stack; `CACHE@N` adapts layer N only, so each process measures its shard from layer N),
and saves each final adapter to RUN_DIR/CACHE/adapter (and the process count to RUN_DIR/CACHE/num_processes), so the
test can recompute the last logged KL in one process from the saved weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

from peft import LoraConfig, get_peft_model
from trl import SFTConfig, SFTTrainer
from two_process_helpers import TWO_CPU_STEPS, train_in_turn

from kinfolk.callbacks.retained_kl import RetainedKLCallback
from kinfolk.callbacks.target_metric import TargetMetricCallback, validation_nll
from kinfolk.testing import build_model, build_tokenizer, prompt_completion_dataset

RETAINED_ROWS = 5  # with batches of 2: three batches, so one rank measures a weight-0 repeat
LORA = LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"])


def retained_data():
    return prompt_completion_dataset(RETAINED_ROWS, seed=7)


def train(spec: str, run_dir: str) -> SFTTrainer:
    cache, _, layer = spec.partition("@")
    tokenizer = build_tokenizer()
    lora = LoraConfig(r=4, target_modules=LORA.target_modules, layers_to_transform=[int(layer)]) if layer else LORA
    model = get_peft_model(build_model("llama", tokenizer=tokenizer), lora)
    args = SFTConfig(output_dir=run_dir, learning_rate=5e-2, **TWO_CPU_STEPS)
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=prompt_completion_dataset(16), processing_class=tokenizer
    )
    trainer.add_callback(
        RetainedKLCallback(trainer, retained_data(), every_n_steps=1, batch_size=2, cache=cache, measure_at_start=True)
    )
    trainer.add_callback(
        TargetMetricCallback(trainer, validation_nll(retained_data(), tokenizer, batch_size=2), every_n_steps=1)
    )
    trainer.train()
    trainer.save_model(f"{run_dir}/adapter")
    if trainer.accelerator.is_main_process:
        Path(run_dir, "num_processes").write_text(str(trainer.accelerator.num_processes))
    return trainer


if __name__ == "__main__":
    run_dir, *caches = sys.argv[1:]
    train_in_turn(caches, lambda cache: train(cache, f"{run_dir}/{cache}"))
