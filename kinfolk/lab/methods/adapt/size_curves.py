"""Every size between a student and its teacher, built in memory, and the statistics of a curve of measured sizes.

`patched_sizes` takes the plan `kinfolk merge patch --all` writes from (`plan_patch(..., all_sizes=True)`) and
builds each output model in memory from the same planned tensors (`materialise`), so a curve of 17 sizes costs no
disk; a test checks a built size against the one `merge patch` writes. Each size is measured against the teacher
by `kinfolk.lab.world.heldout.TeacherReference` (the teacher's log-probabilities computed once, reused for every size).
A curve is, per patch order, the measured sizes k = 0..M; its statistics (`concordance`, `middle`, `step`) are the
real-boomerang experiments' endpoints, each a mean over the two orders.

>>> point = lambda k, depth, nll: {"k": k, "depth": depth, "sources": {"a": {"nll": nll}, "b": {"nll": nll + 2}}}
>>> curve = [point(0, 2, 5.0), point(1, 3, 4.0), point(2, 4, 4.5), point(3, 5, 1.0)]
>>> curves = {order: curve for order in ORDERS}
>>> size_value(curve[0], "nll"), middle(curves, "nll"), step(curves, "nll")
(6.0, 5.0, 3.5)
>>> concordance(curves, "nll")  # of the pairs (2,3) (2,4) (3,4) of different depth, 2 have the deeper one lower
0.6666666666666666
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from kinfolk.lab.methods.adapt.settings import largest_drop
from kinfolk.lab.methods.selection import depth_concordance
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


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def concordance(curves: Mapping[str, list], measure: str) -> float:
    """Depth concordance of `measure` (lower is closer; agreement is negated), mean over orders. The teacher itself
    (k = M: KL 0 by construction) is left out, and so are pairs of equal depth, so with no trend it is 0.5."""
    sign = -1.0 if measure == "agreement" else 1.0
    per_order = []
    for order in ORDERS:
        points = curves[order][:-1]  # k = M is the teacher itself
        depths, values = [p["depth"] for p in points], [sign * size_value(p, measure) for p in points]
        per_order.append(depth_concordance(depths, values, higher_is_better=False))
    return _mean(per_order)


def middle(curves: Mapping[str, list], measure: str) -> float:
    """`measure` at the middle size k = M // 2, mean over orders."""
    return _mean([size_value(curves[o][(len(curves[o]) - 1) // 2], measure) for o in ORDERS])


def step(curves: Mapping[str, list], measure: str) -> float:
    """The largest fall of `measure` from one size to the next larger one (k - 1 to k), mean over orders."""
    return _mean([largest_drop([size_value(p, measure) for p in curves[o]]) for o in ORDERS])


def student(curves: Mapping[str, list], measure: str) -> float:
    """`measure` of the unpatched student (k = 0), mean over orders."""
    return _mean([size_value(curves[o][0], measure) for o in ORDERS])
