"""Typed configs of the ADAPT merge operations, read from YAML and checked before anything is opened.

One dataclass per operation; `load_config(op, path_or_dict)` rejects unknown keys, missing keys and values of the
wrong type or range with a message naming the field. Checks that need the checkpoints (layer ranges, shapes,
layer maps) happen when the plan is built (`kinfolk.plugins.adapt.plan`), still before any tensor is written.

>>> config = load_config("apply-delta", {"init": "students/instruct-init", "delta": "deltas/base", "alpha": 0.5})
>>> config.alpha, config.dtype, config.max_shard_bytes
(0.5, None, 5000000000)
>>> try:
...     load_config("interpolate", {"a": "x", "b": "y", "alpha": "half"})
... except MergeConfigError as error:
...     print(error)
interpolate: field 'alpha' expects a number, got 'half'
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import yaml
from transformers.utils.hub import convert_file_size_to_int

from kinfolk.errors import KinfolkInputError
from kinfolk.plugins.adapt.layer_map import LayerMapError, LayerSelection

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
PATCH_ORDERS = ("front-to-back", "back-to-front")


class MergeConfigError(KinfolkInputError):
    """A merge config with an unknown, missing or invalid field."""


@dataclass(frozen=True)
class MergeConfig:
    """Fields every operation that writes a checkpoint shares."""

    op: ClassVar[str]
    dtype: str | None = field(
        default=None,
        metadata={
            "help": "dtype of the written floating-point tensors (float32, bfloat16, float16, float64); "
            "null keeps each tensor's dtype from the config donor"
        },
    )
    max_shard_size: str | int = field(
        default="5GB", metadata={"help": "largest output shard, in bytes or as '500MB', '5GB' (as save_pretrained)"}
    )
    strict_dtypes: bool = field(
        default=True,
        metadata={
            "help": "refuse inputs whose matching tensors differ in dtype (set false to combine, e.g., a "
            "bfloat16 init with a float32 distilled student)"
        },
    )

    def __post_init__(self):
        if self.dtype is not None and self.dtype not in DTYPES:
            self._fail("dtype", f"expects one of {', '.join(DTYPES)} or null, got {self.dtype!r}")
        try:
            size = convert_file_size_to_int(self.max_shard_size)
        except ValueError:
            size = None
        if not isinstance(size, int) or size <= 0:
            self._fail("max_shard_size", f"expects a positive size such as '5GB', got {self.max_shard_size!r}")

    @property
    def torch_dtype(self) -> torch.dtype | None:
        return DTYPES[self.dtype] if self.dtype else None

    @property
    def max_shard_bytes(self) -> int:
        return convert_file_size_to_int(self.max_shard_size)

    def to_dict(self) -> dict[str, Any]:
        values = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            values[item.name] = value.to_dict() if isinstance(value, LayerSelection) else value
        return values

    def _fail(self, name: str, message: str) -> typing.NoReturn:
        raise MergeConfigError(f"{self.op}: field {name!r} {message}")


@dataclass(frozen=True)
class InitStudentConfig(MergeConfig):
    """Student = a subset of the teacher's layers (the first layer of each block), embeddings, norm and head."""

    op: ClassVar[str] = "init-student"
    teacher: str = field(default="", metadata={"help": "teacher model directory"})
    layers: LayerSelection = field(
        default=None,
        metadata={"help": "which teacher layers to keep: {every: n, first: k, last: k} or {layers: [..]}"},
    )


@dataclass(frozen=True)
class DeltaConfig(MergeConfig):
    """Delta = distilled - init, tensor by tensor (the distillation-induced weight change)."""

    op: ClassVar[str] = "delta"
    init: str = field(default="", metadata={"help": "the student before distillation (init-student output)"})
    distilled: str = field(default="", metadata={"help": "the same student after distillation"})
    dtype: str | None = field(
        default="float32",
        metadata={
            "help": "dtype of the delta; float32 makes apply-delta reproduce bfloat16 models exactly, "
            "float64 float32 ones"
        },
    )


@dataclass(frozen=True)
class DeltaCosineConfig:
    """Cosine similarity between two deltas, per tensor, per layer and overall (does the delta transfer?)."""

    op: ClassVar[str] = "delta-cosine"
    a: str = field(default="", metadata={"help": "first delta directory"})
    b: str = field(default="", metadata={"help": "second delta directory"})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ApplyDeltaConfig(MergeConfig):
    """Model = init + alpha * delta (weight-delta initialisation of a post-trained variant's student)."""

    op: ClassVar[str] = "apply-delta"
    init: str = field(default="", metadata={"help": "the variant's student init (init-student output)"})
    delta: str = field(default="", metadata={"help": "a delta directory written by `kinfolk merge delta`"})
    alpha: float = field(default=1.0, metadata={"help": "scale of the delta"})


@dataclass(frozen=True)
class PatchConfig(MergeConfig):
    """Model = the student with some layers replaced by their teacher blocks (an intermediate size)."""

    op: ClassVar[str] = "patch"
    teacher: str = field(default="", metadata={"help": "teacher model directory"})
    student: str = field(default="", metadata={"help": "student model directory (distilled or delta-initialised)"})
    layer_map: str | None = field(
        default=None, metadata={"help": "layer map JSON; defaults to the student's adapt_layer_map.json"}
    )
    order: Literal["front-to-back", "back-to-front"] = field(
        default="front-to-back",
        metadata={
            "help": "patch the first student layers (the teacher's embeddings come along) or the last ones "
            "(the teacher's final norm and LM head come along)"
        },
    )
    num_patched: int | None = field(default=None, metadata={"help": "how many student layers to patch, in `order`"})
    patched_layers: tuple[int, ...] | None = field(
        default=None, metadata={"help": "explicit student layers to patch (instead of order + num_patched)"}
    )
    # Issue 19: the teacher must be the one the student was initialised from (its recorded fingerprint).
    allow_other_teacher: bool = field(
        default=False,
        metadata={
            "help": "patch with a teacher whose fingerprint differs from the one recorded when the student was "
            "initialised (the same model re-saved, or a deliberate cross-patch); stated in the output's provenance"
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.num_patched is not None and self.patched_layers is not None:
            self._fail("patched_layers", "cannot be combined with num_patched")
        if self.num_patched is not None and self.num_patched < 0:
            self._fail("num_patched", f"expects a non-negative integer, got {self.num_patched}")


@dataclass(frozen=True)
class InterpolateConfig(MergeConfig):
    """Model = (1 - alpha) * a + alpha * b (points on the linear path between two models of one shape)."""

    op: ClassVar[str] = "interpolate"
    a: str = field(default="", metadata={"help": "model at alpha = 0 (also the config donor)"})
    b: str = field(default="", metadata={"help": "model at alpha = 1"})
    alpha: float = field(default=None, metadata={"help": "position on the path"})


CONFIGS: dict[str, type] = {
    config.op: config
    for config in (InitStudentConfig, DeltaConfig, DeltaCosineConfig, ApplyDeltaConfig, PatchConfig, InterpolateConfig)
}


def _coerce(op: str, name: str, hint: Any, value: Any) -> Any:
    """Check `value` against the field's type hint, converting YAML lists and ints where the hint asks."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise MergeConfigError(f"{op}: field {name!r} is required")
    errors = []
    for option in (option for option in options if option is not type(None)):
        if option is LayerSelection:
            if not isinstance(value, dict):
                errors.append("a mapping such as {every: 2, last: 1}")
                continue
            try:
                return LayerSelection.from_dict(value)
            except (LayerMapError, TypeError) as error:
                raise MergeConfigError(f"{op}: field {name!r}: {error}") from None
        if typing.get_origin(option) is Literal:
            if value in typing.get_args(option):
                return value
            errors.append(f"one of {', '.join(map(repr, typing.get_args(option)))}")
        elif typing.get_origin(option) is tuple:
            if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                return tuple(value)
            errors.append("a list of integers")
        elif option is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            errors.append("a number")
        elif option is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            errors.append("an integer")
        elif option in (str, bool):
            if isinstance(value, option):
                return value
            errors.append("a string" if option is str else "true or false")
    raise MergeConfigError(f"{op}: field {name!r} expects {' or '.join(errors)}, got {value!r}")


def load_config(op: str, source: str | Path | dict[str, Any]) -> Any:
    """Build the typed config of `op` from a YAML file or a mapping, refusing unknown or missing fields."""
    if op not in CONFIGS:
        raise MergeConfigError(f"unknown merge operation {op!r}; choose one of {', '.join(CONFIGS)}")
    if isinstance(source, dict):
        values = dict(source)
    else:
        values = yaml.safe_load(Path(source).read_text()) or {}
        if not isinstance(values, dict):
            raise MergeConfigError(f"{op}: {source} must hold a YAML mapping of fields, got {type(values).__name__}")
    cls = CONFIGS[op]
    named = values.pop("op", op)
    if named != op:
        raise MergeConfigError(f"{op}: the config is for another operation (op: {named!r})")
    fields = {item.name: item for item in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise MergeConfigError(f"{op}: unknown field(s) {unknown}; known fields: {', '.join(fields)}")
    hints = typing.get_type_hints(cls)
    arguments = {}
    for name, item in fields.items():
        required = item.default in ("", None) and type(None) not in typing.get_args(hints[name])
        if name in values or required:
            arguments[name] = _coerce(op, name, hints[name], values.get(name))
    return cls(**arguments)
