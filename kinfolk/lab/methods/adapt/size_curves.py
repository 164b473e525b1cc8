"""Every size between a student and its teacher, built in memory, and the statistics of a curve of measured sizes.

`patched_sizes` takes the plan `kinfolk merge patch --all` writes from (`plan_patch(..., all_sizes=True)`) and
builds each output model in memory from the same planned tensors (`materialise`), so a curve of 17 sizes costs no
disk; a test checks a built size against the one `merge patch` writes. Each size is measured against the teacher
by `kinfolk.lab.world.heldout.TeacherReference` (the teacher's log-probabilities computed once, reused for every size),
from the deepest layer it shares bit for bit with the teacher or the unpatched student (`measure_size`): the same
numbers as a full forward, a whole curve in 1.22 times less CPU time (bench/bench_size_curve.py).
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

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from kinfolk.lab.methods.adapt.settings import largest_drop
from kinfolk.lab.methods.selection import depth_concordance
from kinfolk.lab.world.heldout import SourceMeasure, TeacherReference
from kinfolk.layout import decoder_layers
from kinfolk.plugins.adapt.config import PatchConfig
from kinfolk.plugins.adapt.execute import materialise
from kinfolk.plugins.adapt.plan import ModelPlan, plan_patch
from kinfolk.prefix_cache import PrefixCache, shared_prefix_layers

ORDERS = ("front-to-back", "back-to-front")
# A size's layers below L are bit for bit its teacher's or student's, so measuring from L gives the full forward's
# numbers; the check on a size's first batch allows only float noise.
PREFIX_TOLERANCE = 1e-6


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


class SharedPrefixes:
    """What each decoder layer of `source` (the teacher, or a student) receives on `reference`'s rows, captured
    once, so that a size whose first L layers are `source`'s is measured from layer L: a size patched front to
    back starts with the teacher's blocks, one patched back to front with the student's. On SmolLM2's 34 sizes
    57 % of a curve's layer forwards are such shared prefixes (bench/bench_size_curve.py: 782 against 335 a row).

    Memory: rows x length x hidden size x 4 bytes per layer (SmolLM2, 192 rows of 64 tokens: 28 MB a layer)."""

    def __init__(self, source: torch.nn.Module, reference: TeacherReference):
        self.source = source.eval()
        self.batches = [
            {"input_ids": input_ids, "attention_mask": attention_mask}
            for part in reference.rows
            for input_ids, attention_mask, _ in part.batches()
        ]
        layers = range(1, len(decoder_layers(self.source)))  # a one-layer source shares nothing worth keeping
        self.caches = PrefixCache.capture(self.source, self.batches, layers) if layers else {}
        self.checked = False  # whether a size measured from these states matched its full forward

    def layer_for(self, model: torch.nn.Module) -> int:
        """The deepest layer `model` can start at from these states (0: none; at most its last layer)."""
        return min(
            shared_prefix_layers(model, self.source), len(decoder_layers(model)) - 1, max(self.caches, default=0)
        )


def measure_size(
    model: torch.nn.Module, reference: TeacherReference, prefixes: Sequence[SharedPrefixes]
) -> tuple[dict[str, SourceMeasure], int]:
    """`reference.measure(model)`, computed from the deepest layer one of `prefixes` shares with `model`; returns
    the measures and that layer (0: a full forward). The first size measured from each source's states is checked
    on the first batch against its full forward (last hidden states to 1e-6): the layers below were compared
    tensor by tensor, the check catches an architecture whose layers pass more than hidden states."""
    layer, shared = max(((p.layer_for(model), p) for p in prefixes), key=lambda pair: pair[0], default=(0, None))
    if layer == 0:
        return reference.measure(model), 0
    cache = shared.caches[layer]
    if not shared.checked:
        if not cache.same_as_full(model, shared.batches[0], tolerance=PREFIX_TOLERANCE):
            raise RuntimeError(f"a patched size measured from layer {layer} differs from its full forward")
        shared.checked = True
    with cache.injected(model):
        return reference.measure(model), layer


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
