"""kinfolk's training parts on a model sharded with FSDP2 (`fully_shard`), or on one process as the reference.

    python -m torch.distributed.run --nproc_per_node 2 fsdp2_job.py BASE_DIR ADAPTER_DIR OUT.pt

HF `Trainer` refuses FSDP on CPU, so the parts run directly, as the training loop runs them: each of the 2 ranks
takes half of the rows, and FSDP2 averages gradients over the ranks (gloo on CPU). `run(..., sharded=False)` is the
one-process reference over all rows, with the same code. Three parts:

- `atlas`: an ATLAS adapter's forward and backward (loss: summed token NLL from plain logits over the global token
  count, times the world size so FSDP's average gives the one-process gradient);
- `weighted`: `WeightedSFTTrainer.training_step` on full fine-tuning (every weight sharded and trained), its
  micro-batches prepared by `get_batch_samples` (the one-process reference accumulates two micro-batches);
- `retained_kl`: `RetainedKLCallback.measure()` on the ATLAS model, frozen side from the disabled adapter;
  `target`: `TargetMetricCallback.score()` of `validation_nll` on the same model.

Each returns its loss (or KL) and the full gradients (`DTensor.full_tensor()`), saved by rank 0.
"""

from __future__ import annotations

import os
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer
from two_process_helpers import gloo_group

from kinfolk.callbacks import RetainedKLCallback, TargetMetricCallback
from kinfolk.callbacks.target_metric import validation_nll
from kinfolk.layout import decoder_layers
from kinfolk.logprobs import pad_right
from kinfolk.testing import prompt_completion_dataset
from kinfolk.tokens import IGNORE_INDEX, sft_tokenize
from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

ROWS = 4
WEIGHTS = [0.3, 1.7, 2.5, 0.8]
CPU = {"use_cpu": True, "bf16": False, "report_to": [], "save_strategy": "no", "max_length": 64, "seed": 0}


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _shard(model: torch.nn.Module) -> None:
    """FSDP2 as accelerate applies it to a causal LM: each decoder layer, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (_world()[1],))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _my_rows(rows: list, sharded: bool) -> list:
    rank, world = _world()
    return rows[rank * len(rows) // world : (rank + 1) * len(rows) // world] if sharded else rows


def _all_reduce(value: torch.Tensor) -> torch.Tensor:
    if _world()[1] > 1:
        torch.distributed.all_reduce(value)
    return value


def _full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {}
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            grad = parameter.grad
            grads[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().clone()
    return grads


def atlas_and_retained_kl(base_dir: str, adapter_dir: str, output_dir: str, sharded: bool) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir, is_trainable=True)
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(output_dir=output_dir, **CPU),
        train_dataset=prompt_completion_dataset(ROWS),
        processing_class=tokenizer,
    )
    callback = RetainedKLCallback(trainer, prompt_completion_dataset(6, seed=3), batch_size=2)
    target = TargetMetricCallback(
        trainer, validation_nll(prompt_completion_dataset(6, seed=4), tokenizer, batch_size=2)
    )
    if sharded:
        _shard(model)
    retained_kl = callback.measure()["retained_kl"]
    target_score = target.score()

    tokens = sft_tokenize(prompt_completion_dataset(ROWS, seed=1), tokenizer)
    batch = pad_right(list(tokens["input_ids"]), list(tokens["labels"]), tokenizer.pad_token_id)
    total_tokens = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
    mine = {name: torch.cat(_my_rows(list(tensor.split(1)), sharded)) for name, tensor in batch.items()}
    logits = model(input_ids=mine["input_ids"], attention_mask=mine["attention_mask"]).logits[:, :-1]
    labels = mine["labels"][:, 1:]
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    (nll / total_tokens * _world()[1]).backward()
    return {
        "atlas_loss": float(_all_reduce(nll.detach().clone()) / total_tokens),
        "atlas_grads": _full_grads(model),
        "retained_kl": retained_kl,
        "target": target_score,
    }


def training_step_on_my_rows(trainer, model: torch.nn.Module, sharded: bool) -> torch.Tensor:
    """One optimiser step's `training_step`s as the training loop runs them: this rank's half of the trainer's first
    ROWS rows in micro-batches of ROWS // 2 (one process: all of them, two micro-batches), prepared by
    `get_batch_samples`; returns the summed loss of this rank's micro-batches."""
    rows = [trainer.train_dataset[index] for index in range(ROWS)]
    mine = _my_rows(rows, sharded)
    batches = [trainer.data_collator(mine[start : start + ROWS // 2]) for start in range(0, len(mine), ROWS // 2)]
    batches, num_items = trainer.get_batch_samples(iter(batches), len(batches), trainer.args.device)
    trainer.current_gradient_accumulation_steps = len(batches)
    return sum(trainer.training_step(model, batch, num_items) for batch in batches)


def weighted_sft(base_dir: str, output_dir: str, sharded: bool) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    micro_batches = 1 if sharded else 2
    trainer = WeightedSFTTrainer(
        model=model,
        args=WeightedSFTConfig(
            output_dir=output_dir,
            per_device_train_batch_size=ROWS // 2,
            gradient_accumulation_steps=micro_batches,
            weight_reduction="self_normalized",  # its D differs between the ranks: only a global D passes
            prompt_loss_weight=0.2,
            **CPU,
        ),
        train_dataset=prompt_completion_dataset(ROWS, seed=2).add_column("weight", WEIGHTS),
        processing_class=tokenizer,
    )
    sharded_parameters = 0
    if sharded:
        _shard(model)
        sharded_parameters = sum(type(p).__name__ == "DTensor" for p in model.parameters())
    loss = training_step_on_my_rows(trainer, model, sharded)
    return {
        "weighted_loss": float(_all_reduce(loss.clone()) / _world()[1]),
        "weighted_grads": _full_grads(model),
        "sharded_parameters": sharded_parameters,
    }


def run(base_dir: str, adapter_dir: str, output_dir: str, sharded: bool) -> dict:
    torch.manual_seed(0)
    return {
        **atlas_and_retained_kl(base_dir, adapter_dir, os.path.join(output_dir, "atlas"), sharded),
        **weighted_sft(base_dir, os.path.join(output_dir, "weighted"), sharded),
    }


def run_sharded(run_parts) -> None:
    """A job's main under torchrun: `run_parts(FIRST, SECOND, directory of OUT.pt, sharded=True)` over gloo, its
    results saved by rank 0 to OUT.pt (argv: FIRST SECOND OUT.pt), then the group torn down."""
    torch.set_num_threads(1)
    first, second, out = sys.argv[1:4]
    with gloo_group() as (rank, world_size):
        results = run_parts(first, second, os.path.dirname(out), sharded=True)
        results["world_size"] = world_size
        if rank == 0:
            torch.save(results, out)


if __name__ == "__main__":
    run_sharded(run)
