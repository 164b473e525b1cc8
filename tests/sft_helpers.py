"""Shared set-up for the weighted-SFT tests: CPU fp32 configs, trainer pairs on identical data, one-batch gradients,
the hand-written weighted loss, and the flags of a tiny `kinfolk sft` run."""

from __future__ import annotations

import torch
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from kinfolk.compat.trl import FUSED_KERNELS
from kinfolk.logprobs import label_log_probs
from kinfolk.testing import build_model, prompt_completion_dataset
from kinfolk.tokens import IGNORE_INDEX
from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

CPU_FP32 = {
    "use_cpu": True,
    "bf16": False,
    "gradient_checkpointing": False,
    "report_to": "none",
    "save_strategy": "no",
    "logging_steps": 1,
    "per_device_train_batch_size": 4,
    "max_steps": 1,
    "learning_rate": 1e-2,
    "seed": 0,
    "disable_tqdm": True,
}
# `kinfolk sft` flags for a two-step CPU run that saves nothing but the final model.
TINY_RUN = [
    "--use_cpu", "--bf16", "False", "--gradient_checkpointing", "False", "--report_to", "none",
    "--save_strategy", "no", "--max_steps", "2", "--per_device_train_batch_size", "2", "--disable_tqdm", "True",
]  # fmt: skip


def weighted_data(n: int = 8, weights=None, seed: int = 0) -> Dataset:
    weights = [1.0] * n if weights is None else [float(w) for w in weights]
    return prompt_completion_dataset(n, seed=seed).add_column("weight", weights)


def config(cls, output_dir, **overrides):
    return cls(output_dir=str(output_dir), **{**CPU_FP32, **overrides})


def weighted_trainer(
    tokenizer, data, output_dir, model=None, peft_config=None, retained_dataset=None, **overrides
) -> WeightedSFTTrainer:
    return WeightedSFTTrainer(
        model=model or build_model("llama", tokenizer=tokenizer),
        args=config(WeightedSFTConfig, output_dir, **overrides),
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=peft_config,
        retained_dataset=retained_dataset,
    )


def sft_trainer(tokenizer, data, output_dir, model=None, **overrides) -> SFTTrainer:
    return SFTTrainer(
        model=model or build_model("llama", tokenizer=tokenizer),
        args=config(SFTConfig, output_dir, **overrides),
        train_dataset=data,
        processing_class=tokenizer,
    )


def batch_loss_and_grads(trainer, rows=None, num_items_in_batch=None):
    """Loss of one collated batch of the trainer's prepared rows and the gradients it leaves (training mode)."""
    rows = range(len(trainer.train_dataset)) if rows is None else rows
    inputs = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in rows]))
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def parameters(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# The weighted trainer with unit weights against SFTTrainer: bit for bit where both reduce TRL's fused head's
# log-probs (TRL >= 1.15); on TRL 1.14, whose SFTTrainer computes its loss in chunks of hidden states while kinfolk
# computes log-probs from the logits (kinfolk.compat.trl), to float32 rounding.
IDENTITY_REL = 0.0 if FUSED_KERNELS else 1e-6


def assert_same_loss(loss: torch.Tensor, expected: torch.Tensor) -> None:
    assert abs(float(loss - expected)) <= IDENTITY_REL * abs(float(expected)), (float(loss), float(expected))


def assert_same_tensors(left: dict, right: dict, scale: float = 1.0, rel: float = 0.0):
    """Equal tensor by tensor (`scale` × right), exactly or within `rel` × the largest entry of each tensor."""
    assert left.keys() == right.keys()
    for name in left:
        expected = right[name] * scale
        error = float((left[name] - expected).abs().max())
        assert error <= rel * float(expected.abs().max()), f"{name}: max error {error:.3g}"


def reference_weighted_loss(model, batch, weights, prompt_loss_weight, reduction):
    """Σ W·ℓ / D written out per example, from log-probs computed independently of the trainer."""
    total, examples, token_mass, weight_mass = 0.0, 0, 0.0, 0.0
    for row, weight in zip(batch, weights):
        ids = torch.tensor([row["input_ids"]])
        completion = torch.tensor([row["completion_mask"]])
        labels = ids.masked_fill(completion == 0, IGNORE_INDEX) if prompt_loss_weight == 0 else ids
        log_probs, mask = label_log_probs(model, ids, torch.ones_like(ids), labels)
        token_weights = torch.where(completion[:, 1:] == 1, 1.0, prompt_loss_weight) * mask
        total += weight * float(-(log_probs.detach() * token_weights).sum())
        examples += 1
        token_mass += float(token_weights.sum())
        weight_mass += weight * float(token_weights.sum())
    return total / {"token": token_mass, "sequence": examples, "self_normalized": weight_mass}[reduction]
