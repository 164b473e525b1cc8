"""Cosine similarity between two weight deltas: does a base model's distillation delta point the same way as a
post-trained variant's own? (ADAPT App. G reads transfer off this: 0.73 for Qwen-Instruct, 0.30 for Llama.)

Both deltas are streamed tensor by tensor in float64; the result gives the cosine over all weights at once, per
decoder layer, per module type (e.g. every `mlp.down_proj.weight`) and per tensor.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from kinfolk import __version__
from kinfolk.atomic import check_destination, write_json
from kinfolk.plugins.adapt.checkpoint import Checkpoint, compare_manifests, input_fingerprint, same_layer_map
from kinfolk.plugins.adapt.config import DeltaCosineConfig
from kinfolk.plugins.adapt.plan import natural_key


class _Accumulator:
    def __init__(self):
        self.dot = self.norm_a = self.norm_b = 0.0

    def add(self, a: torch.Tensor, b: torch.Tensor) -> None:
        self.dot += float(torch.dot(a, b))
        self.norm_a += float(torch.dot(a, a))
        self.norm_b += float(torch.dot(b, b))

    def merge(self, other: _Accumulator) -> None:
        self.dot += other.dot
        self.norm_a += other.norm_a
        self.norm_b += other.norm_b

    @property
    def cosine(self) -> float | None:
        """None when either delta is zero there (the cosine is undefined)."""
        scale = math.sqrt(self.norm_a * self.norm_b)
        return self.dot / scale if scale > 0 else None


def delta_cosine(config: DeltaCosineConfig, progress: bool = True) -> dict[str, Any]:
    """Cosines between the deltas `config.a` and `config.b` (same tensors, same layer map)."""
    a = Checkpoint.open_delta("a", config.a)
    b = Checkpoint.open_delta("b", config.b)
    layer_map = same_layer_map("delta-cosine", a, b)
    compare_manifests("delta-cosine", "a", a.manifest, "b", b.manifest, check_dtype=False)
    layout = a.layout
    overall, per_tensor = _Accumulator(), {}
    per_layer: dict[int, _Accumulator] = defaultdict(_Accumulator)
    per_module: dict[str, _Accumulator] = defaultdict(_Accumulator)
    names = sorted(a.manifest, key=natural_key)
    for name in tqdm(names, desc="delta-cosine", unit="tensor", disable=not progress):
        stats = _Accumulator()
        stats.add(a.reader.get(name).double().flatten(), b.reader.get(name).double().flatten())
        per_tensor[name] = stats
        overall.merge(stats)
        layer = layout.layer_of(name)
        if layer is not None:
            per_layer[layer].merge(stats)
            per_module[name[len(layout.layer_key(layer)) + 1 :]].merge(stats)
        else:
            per_module[name].merge(stats)
    return {
        "kinfolk_version": __version__,
        "a": {"path": str(a.path), "fingerprint": input_fingerprint(a.path)},
        "b": {"path": str(b.path), "fingerprint": input_fingerprint(b.path)},
        "layer_map": layer_map.to_dict() if layer_map else None,
        "cosine": overall.cosine,
        "per_layer": [{"layer": layer, "cosine": per_layer[layer].cosine} for layer in sorted(per_layer)],
        "per_module": {module: stats.cosine for module, stats in sorted(per_module.items())},
        "per_tensor": {name: stats.cosine for name, stats in per_tensor.items()},
    }


def write_delta_cosine(config: DeltaCosineConfig, out: str | Path, overwrite: bool = False, progress: bool = True):
    """Compute the cosines and write them as JSON to `out` (refused if it exists, unless `overwrite`)."""
    check_destination(out, overwrite)
    result = delta_cosine(config, progress)
    write_json(out, result)
    return result
