"""Typed configs of the ADAPT merge operations, read from YAML and checked before anything is opened.

One dataclass per operation, as mergekit's typed configs: fields without a default are required, and the types on
the fields are the checks. `load_config(op, path_or_dict)` validates a mapping against them with pydantic (unknown,
missing and mistyped fields are refused with a message naming the field). Checks that need the checkpoints (layer
ranges, shapes, layer maps) happen when the plan is built (`kinfolk.plugins.adapt.plan`), still before any tensor
is written. `DeltaCosineConfig` configures a diagnostic (`cosine.py`), not a merge, so it is not in `CONFIGS`.

>>> config = load_config("apply-delta", {"init": "students/instruct-init", "delta": "deltas/base", "alpha": 0.5})
>>> config.alpha, config.dtype, config.max_shard_bytes
(0.5, None, 5000000000)
>>> try:
...     load_config("interpolate", {"a": "x", "b": "y", "alpha": "half"})
... except MergeConfigError as error:
...     print(error)
interpolate: field 'alpha' expects a valid number, unable to parse string as a number; got 'half'
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import yaml
from pydantic import BeforeValidator, ConfigDict, TypeAdapter, ValidationError

from kinfolk.errors import InputError
from kinfolk.plugins.adapt.layer_map import LayerSelection

if TYPE_CHECKING:
    import torch

DType = Literal["float32", "bfloat16", "float16", "float64"]  # torch's dtypes of these names
PATCH_ORDERS = ("front-to-back", "back-to-front")


class MergeConfigError(InputError):
    """A merge config with an unknown, missing or invalid field."""


@dataclass(frozen=True, kw_only=True)
class MergeConfig:
    """Fields every operation that writes a checkpoint shares."""

    op: ClassVar[str]
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")
    dtype: DType | None = field(
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
        try:
            size = self.max_shard_bytes
        except ValueError:
            size = None
        if not isinstance(size, int) or size <= 0:
            self._fail("max_shard_size", f"expects a positive size such as '5GB', got {self.max_shard_size!r}")

    @property
    def torch_dtype(self) -> torch.dtype | None:
        import torch  # here: the configs load without torch (`kinfolk merge --help` lists their keys)

        return getattr(torch, self.dtype) if self.dtype else None

    @property
    def max_shard_bytes(self) -> int:
        from transformers.utils.hub import convert_file_size_to_int

        return convert_file_size_to_int(self.max_shard_size)

    def to_dict(self) -> dict[str, Any]:
        values = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            values[item.name] = value.to_dict() if isinstance(value, LayerSelection) else value
        return values

    def _fail(self, name: str, message: str) -> typing.NoReturn:
        raise MergeConfigError(f"{self.op}: field {name!r} {message}")


@dataclass(frozen=True, kw_only=True)
class InitStudentConfig(MergeConfig):
    """Student = a subset of the teacher's layers (the first layer of each block), embeddings, norm and head."""

    op: ClassVar[str] = "init-student"
    teacher: str = field(metadata={"help": "teacher model directory"})
    # Parsed by the selection itself, not field by field by pydantic (which would read `first: true` as 1 and
    # `layers: [0, "2"]` as [0, 2]), so its own checks name the offending key.
    layers: Annotated[LayerSelection, BeforeValidator(LayerSelection.from_dict)] = field(
        metadata={"help": "which teacher layers to keep: {every: n, first: k, last: k} or {layers: [..]}"}
    )


@dataclass(frozen=True, kw_only=True)
class DeltaConfig(MergeConfig):
    """Delta = distilled - init, tensor by tensor (the distillation-induced weight change)."""

    op: ClassVar[str] = "delta"
    init: str = field(metadata={"help": "the student before distillation (init-student output)"})
    distilled: str = field(metadata={"help": "the same student after distillation"})
    dtype: DType | None = field(
        default="float32",
        metadata={
            "help": "dtype of the delta; float32 makes apply-delta reproduce bfloat16 models exactly, "
            "float64 float32 ones"
        },
    )


@dataclass(frozen=True, kw_only=True)
class ApplyDeltaConfig(MergeConfig):
    """Model = init + alpha * delta (weight-delta initialisation of a post-trained variant's student)."""

    op: ClassVar[str] = "apply-delta"
    init: str = field(metadata={"help": "the variant's student init (init-student output)"})
    delta: str = field(metadata={"help": "a delta directory written by `kinfolk merge delta`"})
    alpha: float = field(default=1.0, metadata={"help": "scale of the delta"})


@dataclass(frozen=True, kw_only=True)
class PatchConfig(MergeConfig):
    """Model = the student with some layers replaced by their teacher blocks (an intermediate size)."""

    op: ClassVar[str] = "patch"
    teacher: str = field(metadata={"help": "teacher model directory"})
    student: str = field(metadata={"help": "student model directory (distilled or delta-initialised)"})
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
    # The teacher must be the one the student was initialised from (its fingerprint, recorded by init-student).
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


@dataclass(frozen=True, kw_only=True)
class InterpolateConfig(MergeConfig):
    """Model = (1 - alpha) * a + alpha * b (points on the linear path between two models of one shape)."""

    op: ClassVar[str] = "interpolate"
    a: str = field(metadata={"help": "model at alpha = 0 (also the config donor)"})
    b: str = field(metadata={"help": "model at alpha = 1"})
    alpha: float = field(metadata={"help": "position on the path"})


@dataclass(frozen=True, kw_only=True)
class DeltaCosineConfig:
    """Cosine similarity between two deltas, per tensor, per layer and overall (does the delta transfer?)."""

    op: ClassVar[str] = "delta-cosine"
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")
    a: str = field(metadata={"help": "first delta directory"})
    b: str = field(metadata={"help": "second delta directory"})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# The merge operations (each writes a checkpoint), by name.
CONFIGS: dict[str, type[MergeConfig]] = {
    config.op: config for config in (InitStudentConfig, DeltaConfig, ApplyDeltaConfig, PatchConfig, InterpolateConfig)
}


def _field_error(cls: type, error: dict[str, Any]) -> MergeConfigError:
    """One pydantic error as the message `load_config` raises."""
    original = error.get("ctx", {}).get("error")
    if isinstance(original, MergeConfigError):  # from a config's own __post_init__ checks
        return original
    name = ".".join(str(part) for part in error["loc"])
    if error["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        known = ", ".join(item.name for item in dataclasses.fields(cls))
        return MergeConfigError(f"{cls.op}: unknown field(s) [{name!r}]; known fields: {known}")
    if error["type"] == "missing":
        return MergeConfigError(f"{cls.op}: field {name!r} is required")
    if error["type"] == "value_error":  # a nested config's own check (e.g. LayerSelection)
        return MergeConfigError(f"{cls.op}: field {name!r}: {error['msg'].removeprefix('Value error, ')}")
    message = error["msg"].removeprefix("Input should be ")
    return MergeConfigError(f"{cls.op}: field {name!r} expects {message}; got {error.get('input')!r}")


def parse_config(cls: type, values: dict[str, Any]) -> Any:
    """`cls` built from `values`, its field types enforced; the first problem as a `MergeConfigError`."""
    try:
        return TypeAdapter(cls).validate_python(values)
    except ValidationError as error:
        errors = error.errors()
        # an unknown field first: a misspelt field is otherwise reported as the real one missing
        unknown = [item for item in errors if item["type"] in ("unexpected_keyword_argument", "extra_forbidden")]
        raise _field_error(cls, (unknown or errors)[0]) from None


def load_config(op: str, source: str | Path | dict[str, Any]) -> Any:
    """Build the typed config of `op` (a merge, or "delta-cosine") from a YAML file or a mapping."""
    known = {**CONFIGS, DeltaCosineConfig.op: DeltaCosineConfig}
    if op not in known:
        raise MergeConfigError(f"unknown merge operation {op!r}; choose one of {', '.join(known)}")
    if isinstance(source, dict):
        values = dict(source)
    else:
        if not Path(source).is_file():
            raise MergeConfigError(f"{op}: config file {source} not found", path=source)
        try:
            values = yaml.safe_load(Path(source).read_text()) or {}
        except yaml.YAMLError as error:
            reason = " ".join(str(error).split())
            raise MergeConfigError(f"{op}: {source} is not valid YAML ({reason})", path=source) from None
        if not isinstance(values, dict):
            raise MergeConfigError(
                f"{op}: {source} must hold a YAML mapping of fields, got {type(values).__name__}", path=source
            )
    named = values.pop("op", op)
    if named != op:
        raise MergeConfigError(f"{op}: the config is for another operation (op: {named!r})")
    try:
        return parse_config(known[op], values)
    except MergeConfigError as error:
        if isinstance(source, dict):
            raise
        raise MergeConfigError(f"{source}: {error}", path=source) from None
