"""Two optimiser steps of LayerDistillationTrainer; run under two processes by tests/test_distil_ddp.py.

    python -m accelerate.commands.launch --multi_gpu --num_processes 2 distil_ddp_job.py TEACHER STUDENT RUN_DIR

Each rank writes RUN_DIR/rank{R}.pt: the logged losses, the student's parameters after training and what it sees
of the teacher (its type, mode, trainable flags and a digest of its weights). `train_once(..., processes=1)` is the
one-process reference over the same 8 rows per step, as 4 micro-batches of 2 (2 processes: 2 micro-batches each).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from kinfolk.process_group import end_training
from kinfolk.testing import prompt_completion_dataset, text_dataset
from kinfolk.trainers import LayerDistillationConfig, LayerDistillationTrainer

OPTIONS = {
    "use_cpu": True, "bf16": False, "report_to": [], "save_strategy": "no", "logging_steps": 1, "seed": 0,
    "per_device_train_batch_size": 2, "max_steps": 4, "optim": "sgd", "learning_rate": 0.05,
    "lr_scheduler_type": "constant", "weight_decay": 0.0, "kl_weight": 0.2, "disable_tqdm": True,
}  # fmt: skip


def train_once(teacher: str, student: str, output_dir: str, processes: int) -> LayerDistillationTrainer:
    """Both phases (2 steps of pre-training text, 2 of SFT rows), 8 rows per optimiser step."""
    trainer = LayerDistillationTrainer(
        model=student,
        teacher_model=teacher,
        args=LayerDistillationConfig(output_dir=output_dir, gradient_accumulation_steps=4 // processes, **OPTIONS),
        train_dataset=prompt_completion_dataset(8),
        pretraining_dataset=text_dataset(8, seed=1),
        processing_class=AutoTokenizer.from_pretrained(student),
    )
    trainer.train()
    return trainer


def digest(model: torch.nn.Module) -> float:
    return float(sum(parameter.detach().double().abs().sum() for parameter in model.parameters()))


def losses(trainer: LayerDistillationTrainer) -> list[dict[str, float]]:
    keys = ("loss", "distill/kl", "distill/cosine_distance")
    return [{key: row[key] for key in keys} for row in trainer.state.log_history if "loss" in row]


if __name__ == "__main__":
    teacher, student, run_dir = sys.argv[1:4]
    trainer = train_once(teacher, student, run_dir, processes=2)
    teacher_model = trainer.teacher_model
    record = {
        "num_processes": trainer.accelerator.num_processes,
        "backend": torch.distributed.get_backend(),
        "student_type": type(trainer.model_wrapped).__name__,
        "teacher_type": type(teacher_model).__name__,
        "teacher_training": teacher_model.training,
        "teacher_trainable": sum(parameter.requires_grad for parameter in teacher_model.parameters()),
        "teacher_digest": digest(teacher_model),
        "losses": losses(trainer),
        "parameters": {name: value.detach().clone() for name, value in trainer.model.named_parameters()},
    }
    torch.save(record, Path(run_dir) / f"rank{trainer.accelerator.process_index}.pt")
    trainer.accelerator.wait_for_everyone()
    end_training(trainer)  # every rank waits, then gloo is torn down (kinfolk.process_group)
