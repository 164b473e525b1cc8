"""One SGD step of WeightedSFTTrainer on 8 weighted rows per mode; run under `accelerate launch` by the DDP tests.

`python -m accelerate.commands.launch --multi_gpu --num_processes 2 weighted_sft_ddp_job.py RUN_DIR MODE [MODE ...]`
trains each mode in turn with 4 rows per process (one launch for all: a launch costs two interpreters with the whole
stack) and writes the updated parameters (and the process count) to RUN_DIR/MODE.pt; the tests compare them with one
process that takes the same 8 rows as 2 micro-batches of 4 (gradient accumulation).
MODE `weights`: full fine-tuning with example weights; `output_kl`: LoRA with the Output-KL regulariser too.
"""

from __future__ import annotations

import os
import sys
from functools import partial

import torch
from peft import LoraConfig
from sft_helpers import parameters, weighted_data, weighted_trainer
from two_process_helpers import train_in_turn

from kinfolk.testing import build_tokenizer, text_dataset

WEIGHTS = [0.3, 1.7, 0.0, 2.5, 0.8, 1.1, 4.0, 0.6]
OPTIONS = {
    "optim": "sgd",
    "learning_rate": 0.5,
    "weight_decay": 0.0,
    "weight_reduction": "self_normalized",  # D differs between the ranks, so only a global D passes
    "prompt_loss_weight": 0.2,
}
MODES = {
    "weights": {},
    "output_kl": {
        "peft_config": LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
        "retained_dataset": text_dataset(6, seed=7),
        "output_kl_coef": 2.0,
        "output_kl_batch_size": 2,
    },
}


def train_once(tokenizer, output_dir, mode: str, processes: int):
    """Rank r's retained batch is the one micro-batch r gets in a single process with `processes` micro-batches."""
    trainer = weighted_trainer(
        tokenizer,
        weighted_data(8, WEIGHTS),
        output_dir,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2 // processes,
        **OPTIONS,
        **MODES[mode],
    )
    trainer.train()
    return trainer


def train_and_save(run_dir: str, mode: str):
    """`mode` trained under the launcher's processes; the main process saves its summary to RUN_DIR/MODE.pt."""
    # The launcher's WORLD_SIZE: the trainer's own distributed state exists only once the trainer does.
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = train_once(build_tokenizer(), f"{run_dir}/{mode}", mode, processes=processes)
    state = trainer.accelerator.state
    if state.is_main_process:
        summary = {"num_processes": state.num_processes, "backend": state.backend}
        summary.update({key: trainer.state.log_history[0][key] for key in ("num_tokens", "loss", "unweighted_loss")})
        torch.save({**summary, "parameters": parameters(trainer.model)}, f"{run_dir}/{mode}.pt")
    return trainer


if __name__ == "__main__":
    run_dir, *modes = sys.argv[1:]
    train_in_turn(modes, partial(train_and_save, run_dir))
