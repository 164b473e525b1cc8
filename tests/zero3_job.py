"""Two SFT steps under DeepSpeed ZeRO-3 on two CPU processes (DeepSpeed's CPU accelerator, gloo), measured by
RetainedKLCallback and TargetMetricCallback's validation NLL of the same rows: full fine-tuning (the retained KL's
frozen side a copy of the head taken at the start) and LoRA (the frozen side the model with its adapter switched off).

`DS_ACCELERATOR=cpu python -m torch.distributed.run --standalone --nproc_per_node 2 zero3_job.py RUN_DIR` loads
RUN_DIR/base after the ZeRO-3 arguments exist, as a user's script does (so every parameter is partitioned), trains
and measures at the start and after each step, saves each run's model or adapter to RUN_DIR/<run>/saved, and writes
RUN_DIR/<run>/sharding.json (the ZeRO stage and whether the parameters were partitioned), so the test can recompute
the last logged KL in one process from the saved weights and know the run was sharded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import deepspeed
from peft import LoraConfig, get_peft_model
from retained_kl_ddp_job import retained_data
from transformers import AutoModelForCausalLM
from two_process_helpers import TWO_CPU_STEPS, train_in_turn

from kinfolk.callbacks.retained_kl import RetainedKLCallback
from kinfolk.callbacks.target_metric import TargetMetricCallback, validation_nll
from kinfolk.sharding import zero3_partitioned, zero_stage
from kinfolk.testing import build_tokenizer, prompt_completion_dataset
from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

RUNS = ("full", "lora")
ZERO3 = {
    "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
    "zero_allow_untested_optimizer": True,
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
}


def train(run: str, run_dir: Path) -> WeightedSFTTrainer:
    tokenizer = build_tokenizer()
    rate = 5e-2 if run == "lora" else 1e-3
    args = WeightedSFTConfig(
        output_dir=str(run_dir / run), learning_rate=rate, weight_column=None, deepspeed=ZERO3, **TWO_CPU_STEPS
    )
    model = AutoModelForCausalLM.from_pretrained(run_dir / "base")  # after the arguments: loaded partitioned
    if run == "lora":
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    trainer = WeightedSFTTrainer(
        model=model, args=args, train_dataset=prompt_completion_dataset(16), processing_class=tokenizer
    )
    trainer.add_callback(
        RetainedKLCallback(trainer, retained_data(), every_n_steps=1, batch_size=2, measure_at_start=True)
    )
    trainer.add_callback(
        TargetMetricCallback(trainer, validation_nll(retained_data(), tokenizer, batch_size=2), every_n_steps=1)
    )
    trainer.train()
    trainer.save_model(str(run_dir / run / "saved"))
    if trainer.accelerator.is_main_process:
        sharding = {"zero_stage": zero_stage(trainer), "partitioned": zero3_partitioned(trainer.model)}
        (run_dir / run / "sharding.json").write_text(json.dumps(sharding))
    return trainer


if __name__ == "__main__":
    # accelerate starts DeepSpeed's process group only where an accelerator backend exists; on CPU it starts gloo
    # itself, and DeepSpeed's communication layer must wrap that group before ZeRO-3 partitions a model
    deepspeed.init_distributed(dist_backend="gloo")
    run_dir = Path(sys.argv[1])
    train_in_turn(RUNS, lambda run: train(run, run_dir))
