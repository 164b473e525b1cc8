"""One SGD step of WeightedSFTTrainer on 8 weighted rows; run under `accelerate launch` by the DDP test.

`python -m accelerate.commands.launch --num_processes 2 --cpu weighted_sft_ddp_job.py RUN_DIR OUT.pt` trains with
4 rows per process and writes the updated parameters (and the process count) to OUT.pt; the test compares them with one process, 8 rows.
"""

from __future__ import annotations

import sys

from sft_helpers import parameters, weighted_data, weighted_trainer

WEIGHTS = [0.3, 1.7, 0.0, 2.5, 0.8, 1.1, 4.0, 0.6]
OPTIONS = {
    "optim": "sgd",
    "learning_rate": 0.5,
    "weight_decay": 0.0,
    "weight_reduction": "self_normalized",  # D differs between the ranks, so only a global D passes
    "prompt_loss_weight": 0.2,
}


def train_once(tokenizer, output_dir, per_device_batch: int):
    trainer = weighted_trainer(
        tokenizer, weighted_data(8, WEIGHTS), output_dir, per_device_train_batch_size=per_device_batch, **OPTIONS
    )
    trainer.train()
    return trainer


if __name__ == "__main__":
    import os

    import torch

    from kinfolk.testing import build_tokenizer

    run_dir, out = sys.argv[1:3]
    # The launcher's WORLD_SIZE: the trainer's own distributed state exists only once the trainer does.
    trainer = train_once(build_tokenizer(), run_dir, per_device_batch=8 // int(os.environ.get("WORLD_SIZE", "1")))
    state = trainer.accelerator.state
    if state.is_main_process:
        summary = {"num_processes": state.num_processes, "backend": state.backend}
        torch.save(
            {
                **summary,
                "num_tokens": trainer.state.log_history[0]["num_tokens"],
                "parameters": parameters(trainer.model),
            },
            out,
        )
