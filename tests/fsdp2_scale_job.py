"""fit_atlas and LayerDistillationTrainer on models sharded with FSDP2 (`fully_shard`, gloo), or in one process.

    python -m torch.distributed.run --nproc_per_node 2 fsdp2_scale_job.py TEACHER STUDENT OUT.pt

HF `Trainer` refuses FSDP on CPU, so the parts run as tests/fsdp2_job.py runs them: each rank takes half of the
rows, and FSDP2 averages gradients over the ranks. `run(..., sharded=False)` is the one-process reference.
- `atlas`: `fit_atlas` on the sharded model with the same data on every rank (each rank fits on its share);
- `distil`: `LayerDistillationTrainer.training_step` on the sharded student (the teacher whole and frozen), its
  micro-batches from `get_batch_samples` (one process accumulates two).
"""

from __future__ import annotations

import os

import torch
from fsdp2_job import ROWS, _all_reduce, _full_grads, _shard, _world, run_sharded, training_step_on_my_rows
from peft import get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from kinfolk.plugins.atlas import AtlasConfig, fit_atlas
from kinfolk.testing import prompt_completion_dataset, text_dataset
from kinfolk.trainers import LayerDistillationConfig, LayerDistillationTrainer

CPU = {"use_cpu": True, "bf16": False, "report_to": [], "save_strategy": "no", "max_length": 64, "seed": 0}


def atlas(teacher_dir: str, sharded: bool) -> dict:
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(teacher_dir), AtlasConfig(r=4, num_regions=1))
    if sharded:
        _shard(model.base_model.model)
    tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    report = fit_atlas(model, text_dataset(7), tokenizer=tokenizer, batch_size=2, progress=False)
    buffers = {name: tensor.clone() for name, tensor in model.named_buffers() if "atlas_" in name}
    return {"atlas": buffers, "atlas_rank_rows": report.rank_rows}


def distil(teacher_dir: str, student_dir: str, output_dir: str, sharded: bool) -> dict:
    micro_batches = 1 if sharded else 2
    trainer = LayerDistillationTrainer(
        model=student_dir,
        teacher_model=teacher_dir,
        args=LayerDistillationConfig(
            output_dir=output_dir,
            per_device_train_batch_size=ROWS // 2,
            gradient_accumulation_steps=micro_batches,
            kl_weight=0.2,
            **CPU,
        ),
        train_dataset=prompt_completion_dataset(ROWS, seed=2),
        processing_class=AutoTokenizer.from_pretrained(student_dir),
    )
    model = trainer.model
    if sharded:
        _shard(model)
    loss = training_step_on_my_rows(trainer, model, sharded)
    return {"distil_loss": float(_all_reduce(loss.clone()) / _world()[1]), "distil_grads": _full_grads(model)}


def run(teacher_dir: str, student_dir: str, output_dir: str, sharded: bool) -> dict:
    torch.manual_seed(0)
    results = {}
    for name, part in (("atlas", lambda: atlas(teacher_dir, sharded)),
                       ("distil", lambda: distil(teacher_dir, student_dir, os.path.join(output_dir, "d"), sharded))):  # fmt: skip
        try:
            results.update(part())
        except Exception as error:  # recorded, so the test can say which part fails under FSDP2
            results[f"{name}_error"] = f"{type(error).__name__}: {error}"
    return results


if __name__ == "__main__":
    run_sharded(run)
