"""Every size between a student and its teacher, built in memory, and each size measured against the teacher.

`patched_sizes` takes the plan `kinfolk merge patch --all` writes from (`plan_patch(..., all_sizes=True)`) and
builds each output model in memory from the same planned tensors (`materialise`), so a curve of 17 sizes costs no
disk; a test checks a built size against the one `merge patch` writes. Each size is measured against the teacher
by `kinfolk.lab.world.heldout.TeacherReference` (the teacher's log-probabilities computed once, reused for every size).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from kinfolk.plugins.adapt.config import PatchConfig
from kinfolk.plugins.adapt.execute import materialise
from kinfolk.plugins.adapt.plan import ModelPlan, plan_patch

ORDERS = ("front-to-back", "back-to-front")


def size_value(point: Mapping[str, Any], measure: str) -> float:
    """A size's `measure` (nll, kl or agreement) averaged over the sources, each with equal weight."""
    values = [source[measure] for source in point["sources"].values()]
    return sum(values) / len(values)


def build_size(model_plan: ModelPlan, inputs) -> torch.nn.Module:
    """One planned output model in memory, from exactly the tensors `merge patch` would write."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(model_plan.config, dtype=torch.float32)
    state = {tensor.name: materialise(tensor, inputs) for tensor in model_plan.tensors}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {f"{inputs['teacher'].layout.lm_head}.weight"} if model_plan.config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"patched size: missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
    model.tie_weights()
    return model.eval()


def patched_sizes(teacher: str | Path, student: str | Path, order: str) -> Iterator[tuple[dict, torch.nn.Module]]:
    """(summary, model) for k = 0..M patched blocks in `order`; the summary is the plan's (k, num_layers, ...)."""
    plan = plan_patch(PatchConfig(teacher=str(teacher), student=str(student), order=order), all_sizes=True)
    for model_plan in plan.models:
        model = build_size(model_plan, plan.inputs)
        summary = {
            "k": model_plan.summary["k"],
            "depth": model_plan.summary["num_layers"],
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        yield summary, model
