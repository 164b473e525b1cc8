"""The inputs of a merge, opened lazily: a model (or delta) directory's tensor manifest, config, layout and layer map.

Opening reads only JSON files and safetensors headers, so a plan can check every name, shape and dtype of
several multi-gigabyte checkpoints before a single tensor is loaded. `compare_manifests` is the one place that
decides whether two checkpoints line up; its errors name the first mismatching tensor and what is wrong with it.

>>> left = {"a": ((2,), "F32"), "b": ((3,), "F32")}
>>> try:
...     compare_manifests("apply-delta", "init", left, "delta", {"a": ((2,), "F32"), "b": ((4,), "F32")})
... except TensorMismatchError as error:
...     print(error.kind, error.tensor, "|", error)
shape b | apply-delta: tensor 'b' has shape (3,) in init but (4,) in delta (1 mismatching tensor)
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig

from kinfolk.atomic import directory_fingerprint
from kinfolk.errors import CheckpointError, InputError, LayerMapMismatchError, TensorMismatchError
from kinfolk.inputs import model_config, read_json
from kinfolk.layout import ModelLayout, check_state_dict_layout, layout_from_config
from kinfolk.plugins.adapt.layer_map import LAYER_MAP_FILE, LayerMap
from kinfolk.tensors import TensorReader

Manifest = dict[str, tuple[tuple[int, ...], str]]
DELTA_FILE = "adapt_delta.json"
PROVENANCE_FILE = "kinfolk_merge.json"
DELTA_FORMAT = "kinfolk-adapt-delta"

# safetensors header dtype strings <-> torch dtypes
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


@dataclass
class Checkpoint:
    """One opened input: `role` is its name in the config (teacher, student, init, delta, a, b, ...)."""

    role: str
    path: Path
    reader: TensorReader
    manifest: Manifest
    config: PretrainedConfig
    layout: ModelLayout
    layer_map: LayerMap | None
    delta_info: dict[str, Any] | None = None

    @classmethod
    def open_model(cls, role: str, path: str | Path) -> Checkpoint:
        """A Hugging Face model directory (config.json plus safetensors weights) of a supported architecture."""
        path = _existing_directory(role, path)
        if not (path / "config.json").exists():
            raise CheckpointError(f"{role}: {path} has no config.json, so it is not a model directory", path=path)
        return cls._open(role, path, lambda: model_config(path, role), delta_info=None)

    @classmethod
    def open_delta(cls, role: str, path: str | Path) -> Checkpoint:
        """A delta directory written by `kinfolk merge delta` (safetensors plus adapt_delta.json)."""
        path = _existing_directory(role, path)
        if not (path / DELTA_FILE).exists():
            raise CheckpointError(
                f"{role}: {path} has no {DELTA_FILE}, so it is not a delta; make one with `kinfolk merge delta`"
            )
        info = read_json(path / DELTA_FILE, f"{role}'s delta record")
        if not isinstance(info, dict) or info.get("format") != DELTA_FORMAT or "config" not in info:
            found = info.get("format") if isinstance(info, dict) else type(info).__name__
            raise CheckpointError(
                f"{role}: {path / DELTA_FILE} is not a kinfolk delta record (format {found!r})", path=path / DELTA_FILE
            )

        def delta_config() -> PretrainedConfig:
            config_values = dict(info["config"])
            return AutoConfig.for_model(config_values.pop("model_type"), **config_values)

        return cls._open(role, path, delta_config, delta_info=info)

    @classmethod
    def _open(cls, role: str, path: Path, load_config, delta_info: dict | None) -> Checkpoint:
        """Open the weights' headers, config, layout and layer map; every error names `role` and the file."""
        try:
            config = load_config()
            reader = TensorReader(path)
            manifest = reader.manifest()
            layout = layout_from_config(config)
            check_state_dict_layout(layout, manifest)
            if delta_info is not None:
                layer_map = LayerMap.from_dict(delta_info["layer_map"]) if delta_info.get("layer_map") else None
            else:
                layer_map = LayerMap.find(path)
        except InputError as error:
            message = str(error) if str(error).startswith(f"{role}") else f"{role} ({path}): {error}"
            raise _same_kind(error, message) from None
        except (FileNotFoundError, ValueError) as error:  # the libraries' own refusals, e.g. a delta's config
            raise CheckpointError(f"{role} ({path}): {error}", path=path) from None
        return cls(role, path, reader, manifest, config, layout, layer_map, delta_info)

    @functools.cached_property
    def fingerprint(self) -> str:
        """`input_fingerprint` of this input's directory (computed once: patching checks it, provenance records it)."""
        return input_fingerprint(self.path)

    def recorded_teacher_fingerprint(self) -> tuple[str | None, Path | None]:
        """The fingerprint of the teacher this student was made from, and the file that records it: its layer map
        (written by init-student, kept by distillation, apply-delta and patch), else the `kinfolk_merge.json` of an
        init-student output made before layer maps carried it."""
        if self.layer_map is not None and self.layer_map.teacher_fingerprint:
            return self.layer_map.teacher_fingerprint, self.path / LAYER_MAP_FILE
        provenance = self.path / PROVENANCE_FILE
        if provenance.is_file():
            record = read_json(provenance, f"{self.role}'s merge record")
            teacher = record.get("inputs", {}).get("teacher", {}) if record.get("op") == "init-student" else {}
            if teacher.get("fingerprint"):
                return teacher["fingerprint"], provenance
        return None, None

    def layer_tensors(self, layer: int) -> list[str]:
        """Names of the tensors of decoder layer `layer`."""
        return [name for name in self.manifest if self.layout.layer_of(name) == layer]

    def non_layer_tensors(self) -> list[str]:
        return [name for name in self.manifest if self.layout.layer_of(name) is None]

    def head_tensor(self) -> str:
        """The tensor that serves as this model's LM head: `lm_head.weight`, or the embeddings when tied and unsaved."""
        head = f"{self.layout.lm_head}.weight"
        if head in self.manifest:
            return head
        if self.layout.tied_embeddings:
            return f"{self.layout.embeddings}.weight"
        raise CheckpointError(f"{self.role}: {self.path} has no {head} and does not tie its embeddings")


def input_fingerprint(path: str | Path) -> str:
    """Content fingerprint of an input directory for provenance (xxh3 of every JSON and safetensors file:
    fast enough to run beside a merge of many gigabytes)."""
    return "xxh3-" + directory_fingerprint(path, algorithm="xxh3_128")


def _existing_directory(role: str, path: str | Path) -> Path:
    path = Path(path)
    if not path.is_dir():
        problem = "is a file, not a directory" if path.exists() else "does not exist"
        raise CheckpointError(f"{role}: {path} {problem}", path=path)
    return path


def _same_kind(error: InputError, message: str) -> InputError:
    """A copy of `error` (same type, path and details) with another message."""
    renamed = copy.copy(error)
    renamed.args = (message,)
    return renamed


def compare_manifests(
    op: str, left_role: str, left: Manifest, right_role: str, right: Manifest, check_dtype: bool = True
) -> None:
    """Raise `TensorMismatchError` for the first tensor (in name order) that differs between two manifests."""
    problems = []
    for name in sorted(set(left) | set(right)):
        if name not in right:
            problems.append(("missing", name, f"tensor {name!r} of {left_role} is missing from {right_role}"))
        elif name not in left:
            problems.append(("extra", name, f"tensor {name!r} of {right_role} is not in {left_role}"))
        elif left[name][0] != right[name][0]:
            detail = f"has shape {left[name][0]} in {left_role} but {right[name][0]} in {right_role}"
            problems.append(("shape", name, f"tensor {name!r} {detail}"))
        elif check_dtype and left[name][1] != right[name][1]:
            detail = f"is {left[name][1]} in {left_role} but {right[name][1]} in {right_role}"
            problems.append(("dtype", name, f"tensor {name!r} {detail} (set strict_dtypes: false to combine them)"))
    if problems:
        kind, name, message = problems[0]
        count = f"{len(problems)} mismatching tensor" + ("s" if len(problems) > 1 else "")
        raise TensorMismatchError(f"{op}: {message} ({count})", kind, name)


def same_layer_map(op: str, first: Checkpoint, second: Checkpoint, allow_one_missing: bool = False) -> LayerMap | None:
    """The layer map two inputs share; refuse two different maps (and, unless allowed, a map on one side only)."""
    maps = {checkpoint.role: checkpoint.layer_map for checkpoint in (first, second)}
    present = {role: layer_map for role, layer_map in maps.items() if layer_map is not None}
    if len(present) == 2 and first.layer_map != second.layer_map:
        raise LayerMapMismatchError(
            f"{op}: {first.role} and {second.role} were built on different layer maps "
            f"({first.role}: {first.layer_map.describe()}; {second.role}: {second.layer_map.describe()})"
        )
    if len(present) == 1 and not allow_one_missing:
        (has,) = present
        lacks = second.role if has == first.role else first.role
        raise LayerMapMismatchError(
            f"{op}: {has} was built on a layer map ({present[has].describe()}) but {lacks} has none, so they "
            f"cannot be checked to match; was {lacks} made by `kinfolk merge init-student`?"
        )
    return next(iter(present.values()), None)
