"""Shared by the layer-distillation tests: a CPU config, a trainer's first batch, and the trainer's loss written out
from full logits and forward hooks, independently of the trainer."""

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from kinfolk.trainers import LayerDistillationConfig


def make_args(tmp_path, **overrides):
    values = {"output_dir": str(tmp_path / "out"), "use_cpu": True, "bf16": False, "report_to": [],
              "per_device_train_batch_size": 4, "save_strategy": "no", "logging_steps": 1, "seed": 0}  # fmt: skip
    values.update(overrides)
    return LayerDistillationConfig(**values)


def first_batch(trainer):
    trainer.model.train()
    return trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))


def layer_outputs(model, inputs):
    """Full-logit forward with each decoder layer's own output recorded by forward hooks."""
    outputs = []
    handles = [
        layer.register_forward_hook(lambda module, args, output: outputs.append(output[0] if isinstance(output, tuple) else output))
        for layer in model.model.layers
    ]  # fmt: skip
    logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    for handle in handles:
        handle.remove()
    return logits.float(), outputs


def reference_loss(pair, inputs, kl_weight, cosine_weight, temperature, aligned, mask=None):
    """The loss from full logits; `mask` (batch, length − 1) marks the positions whose next token is trained
    (default: where the batch's labels are not -100), the targets are then the next input tokens."""
    student = AutoModelForCausalLM.from_pretrained(pair["student"])
    teacher = AutoModelForCausalLM.from_pretrained(pair["teacher"]).eval()
    student_logits, student_layers = layer_outputs(student, inputs)
    with torch.no_grad():
        teacher_logits, teacher_layers = layer_outputs(teacher, inputs)
    if mask is None:
        labels = inputs["labels"][:, 1:]
        mask = labels != -100
    else:
        labels = inputs["input_ids"][:, 1:]
    count = mask.sum()
    log_probs = student_logits[:, :-1].log_softmax(-1)
    ce = -log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)[mask].sum() / count
    student_soft = (student_logits[:, :-1] / temperature).log_softmax(-1)[mask]
    teacher_soft = (teacher_logits[:, :-1] / temperature).log_softmax(-1)[mask]
    kl = (teacher_soft.exp() * (teacher_soft - student_soft)).sum() / count
    cosine = (
        sum(
            (1 - F.cosine_similarity(student_layers[i][:, :-1][mask], teacher_layers[t][:, :-1][mask], dim=-1)).sum()
            for i, t in enumerate(aligned)
        )
        / count
    )
    return ce + kl_weight * temperature**2 * kl + cosine_weight * cosine
