"""How the lab trains: `WeightedSFTTrainer` on CPU with the lab's step budgets, then an atomic save (the ADAPT
experiment's distillations run through `kinfolk distil`, `kinfolk.commands.distil.distil`).

Every model of the family and every run of the demo goes through `lab_trainer`, so they share one recipe:
AdamW, cosine schedule with a short warm-up, prompt tokens down-weighted (`prompt_loss_weight`), sequences of at
most the tokenizer's 64 characters, no checkpoints (the budgets are minutes), a fixed seed, fp32 (no CPU bf16
autocast). Builds, experiments and every evaluation run inside `single_threaded()`, so a seed gives the same bits
whatever the machine's load, and a saved model gives the same scores in any process.

>>> import torch
>>> with single_threaded():
...     torch.get_num_threads()
1
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedModel

from kinfolk.atomic import atomic_directory
from kinfolk.lab.world.tokenizer import MAX_LENGTH


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Run torch on one CPU thread inside the block.

    The thread count changes the order of float reductions (50 AdamW steps of a small MLP already differ in their
    bits between 1 and 2 threads), and a lab skill learned through a phase transition can hang on those bits; one
    thread gives every reduction one order, so the same seed gives the same weights on any machine load."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def lab_trainer(
    model: PreTrainedModel | str | Path,
    dataset: Dataset,
    tokenizer,
    output_dir: str | Path,
    steps: int,
    learning_rate: float,
    *,
    batch_size: int = 32,
    prompt_loss_weight: float = 0.1,
    seed: int = 0,
    weight_column: str | None = None,
    progress: bool = True,
    retained_dataset: Dataset | None = None,
    max_length: int = MAX_LENGTH,
    prepared: dict[str, Dataset] | None = None,
    **config_overrides,
):
    """A `WeightedSFTTrainer` for `steps` optimiser steps of `batch_size` examples on the CPU.

    `retained_dataset` feeds the forgetting regularisers (`replay_ratio`, `output_kl_coef` in `config_overrides`).
    `prepared`: a dict shared by trainers that may train on the same rows, so that they prepare them once
    (`kinfolk.lab.world.prepared`)."""
    from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

    if isinstance(model, (str, Path)):
        model = AutoModelForCausalLM.from_pretrained(model)
    # fp32 unless asked otherwise: TRL's default bf16=True trains under CPU bf16 autocast, whose bits depend on the
    # CPU's bf16 support, and leaves the autocast wrapper on the trained model, so numbers measured in memory would
    # not be those of the saved weights
    options = {"bf16": False} | config_overrides
    args = WeightedSFTConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=min(50, steps // 10),
        weight_column=weight_column,
        prompt_loss_weight=prompt_loss_weight,
        max_length=max_length,
        logging_steps=max(1, steps // 5),
        save_strategy="no",
        report_to=[],
        seed=seed,
        data_seed=seed,
        disable_tqdm=not progress,
        gradient_checkpointing=False,  # TRL turns it on by default; on models this small it only costs time
        **options,
    )
    data = {"train_dataset": dataset, "processing_class": tokenizer, "retained_dataset": retained_dataset}
    if prepared is None:
        return WeightedSFTTrainer(model=model, args=args, **data)
    from kinfolk.lab.world.prepared import PreparingOnce

    return PreparingOnce(model=model, args=args, prepared=prepared, **data)


def save_model(model: PreTrainedModel, tokenizer, out: str | Path) -> Path:
    """Save `model` (or a PEFT adapter) with the tokenizer, appearing at `out` only when complete."""
    with atomic_directory(out, overwrite=True) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    return Path(out)
