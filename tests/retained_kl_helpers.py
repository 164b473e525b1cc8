"""Shared by the retained-KL tests: a tiny SFT run's config, and the retained KL and the target score (minus the NLL)
computed independently of the callbacks."""

import torch
from trl import SFTConfig

from kinfolk.tokens import sft_tokenize


def sft_config(tmp_path, **overrides):
    values = {
        "output_dir": str(tmp_path / "run"),
        "max_steps": 3,
        "per_device_train_batch_size": 4,
        "learning_rate": 5e-2,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "seed": 0,
        "max_length": 64,
        "dataloader_num_workers": 0,
        "bf16": False,  # accelerate would wrap forward in CPU autocast, and the reference must be fp32
    }
    values.update(overrides)
    return SFTConfig(**values)


def reference_retained_kl(frozen, current, tokenizer, retained, positions="response"):
    """Pooled token mean of KL(frozen‖current) from full logits, one context at a time."""
    tokens = sft_tokenize(retained, tokenizer)
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, labels in zip(tokens["input_ids"], tokens["labels"]):
            ids_t = torch.tensor([ids])
            log_p = torch.log_softmax(frozen(input_ids=ids_t).logits[0, :-1].float(), -1)
            log_q = torch.log_softmax(current(input_ids=ids_t).logits[0, :-1].float(), -1)
            scored = (
                torch.tensor(labels[1:]) != -100 if positions == "response" else torch.ones(len(ids) - 1, dtype=bool)
            )
            kl = (log_p.exp() * (log_p - log_q)).sum(-1)
            total += float(kl[scored].sum())
            count += int(scored.sum())
    return total / count


def reference_target(model, tokenizer, rows) -> float:
    """Minus the mean NLL per completion token, from plain full forwards one row at a time."""
    tokens = sft_tokenize(rows, tokenizer)
    total = count = 0.0
    with torch.no_grad():
        for ids, labels in zip(tokens["input_ids"], tokens["labels"]):
            log_probs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].double(), -1)
            targets = torch.tensor(labels[1:])
            scored = targets != -100
            total += float(log_probs[torch.arange(len(targets)), targets.clamp(min=0)][scored].sum())
            count += int(scored.sum())
    return total / count
