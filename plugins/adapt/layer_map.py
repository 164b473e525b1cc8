"""Which teacher layers a student keeps, and which teacher block each student layer stands for.

Boomerang distillation partitions the N teacher layers into M blocks of consecutive layers; student layer i is
initialised from the first layer of block i = [a_i, b_i) and is later aligned with the output of its last layer
b_i - 1. Patching puts the whole block back. A `LayerSelection` is the user's rule (keep every n-th layer, the
first / last k, or an explicit list); `LayerMap` is the resulting partition, saved beside the student as
`adapt_layer_map.json` so later stages (distillation, deltas, patching) all use the same one. The map also carries
the fingerprint of the teacher it was made from, so patching can check that the teacher it is given is that one.

>>> layer_map = LayerSelection(every=2, last=1).resolve(8)  # boomerang: every other layer, and the last
>>> layer_map.kept_layers, layer_map.blocks
([0, 2, 4, 6, 7], ((0, 2), (2, 4), (4, 6), (6, 7), (7, 8)))
>>> layer_map.aligned_teacher_layers
[1, 3, 5, 6, 7]
>>> LayerSelection(first=9).resolve(4)
Traceback (most recent call last):
...
kinfolk.errors.LayerMapError: first: 9 is more than the teacher's 4 layers (keep at most 4)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinfolk.errors import CorruptFileError, LayerMapError, MissingInputError

LAYER_MAP_FILE = "adapt_layer_map.json"
_FORMAT = "kinfolk-adapt-layer-map"


@dataclass(frozen=True)
class LayerSelection:
    """A rule for the teacher layers a student keeps: the union of every n-th, the first k and the last k layers,
    or an explicit list. Layer 0 must be kept, since each kept layer starts a block of consecutive layers."""

    every: int | None = field(default=None, metadata={"help": "keep layers 0, n, 2n, ..."})
    first: int | None = field(default=None, metadata={"help": "keep layers 0 .. k-1"})
    last: int | None = field(default=None, metadata={"help": "keep the last k layers"})
    layers: tuple[int, ...] | None = field(default=None, metadata={"help": "keep exactly these layers"})

    def __post_init__(self):
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(self.layers))
            if any(value is not None for value in (self.every, self.first, self.last)):
                raise LayerMapError("layers: an explicit list cannot be combined with every / first / last")
            if not self.layers:
                raise LayerMapError("layers: the explicit list is empty")
            if not all(isinstance(value, int) and not isinstance(value, bool) for value in self.layers):
                raise LayerMapError(f"layers: expected a list of layer indices, got {list(self.layers)}")
        elif all(value is None for value in (self.every, self.first, self.last)):
            raise LayerMapError("a layer selection needs one of: every, first, last, layers")
        for name in ("every", "first", "last"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise LayerMapError(f"{name}: expected a positive integer, got {value!r}")

    def kept(self, num_layers: int) -> list[int]:
        """The teacher layers kept, refusing any part of the rule that reaches past the teacher's `num_layers`
        (a rule that would be clamped to fit is a rule meant for another teacher)."""
        if self.layers is not None:
            kept = list(self.layers)
            outside = [index for index in kept if not 0 <= index < num_layers]
            if outside:
                raise LayerMapError(f"layers: {outside} are outside the teacher's layers 0..{num_layers - 1}")
            if len(set(kept)) != len(kept):
                raise LayerMapError(f"layers: {kept} lists a layer twice")
            if kept != sorted(kept):
                raise LayerMapError(f"layers: {kept} must be in increasing order (blocks are consecutive layers)")
            return kept
        for name in ("every", "first", "last"):
            value = getattr(self, name)
            if value is not None and value > num_layers:
                raise LayerMapError(
                    f"{name}: {value} is more than the teacher's {num_layers} layers (keep at most {num_layers})"
                )
        kept = set()
        if self.every is not None:
            kept.update(range(0, num_layers, self.every))
        if self.first is not None:
            kept.update(range(self.first))
        if self.last is not None:
            kept.update(range(num_layers - self.last, num_layers))
        return sorted(kept)

    def resolve(self, num_layers: int, teacher_fingerprint: str | None = None) -> LayerMap:
        """The layer map this rule gives on a teacher with `num_layers` layers (and `teacher_fingerprint`)."""
        kept = self.kept(num_layers)
        if kept[0] != 0:
            raise LayerMapError(
                f"the selection keeps layers {kept[:8]} but not layer 0: each kept layer starts a block of "
                "consecutive teacher layers, so the first block must start at layer 0"
            )
        ends = [*kept[1:], num_layers]
        return LayerMap(num_layers, tuple(zip(kept, ends)), self.to_dict(), teacher_fingerprint)

    def to_dict(self) -> dict[str, Any]:
        return {name: value if name != "layers" else list(value) for name, value in vars(self).items() if value}

    @classmethod
    def from_dict(cls, values: dict[str, Any] | LayerSelection) -> LayerSelection:
        """The selection a config's mapping describes (a selection is returned as it is)."""
        if isinstance(values, LayerSelection):
            return values
        if not isinstance(values, dict):
            raise LayerMapError(
                f"expected a mapping such as {{every: 2, last: 1}} or {{layers: [0, 2]}}, got {values!r}"
            )
        unknown = set(values) - {"every", "first", "last", "layers"}
        if unknown:
            raise LayerMapError(f"unknown layer-selection key(s) {sorted(unknown)}; use every, first, last or layers")
        return cls(**values)


@dataclass(frozen=True)
class LayerMap:
    """Student layer i <- teacher block `blocks[i]` = [a, b) of a teacher with `teacher_num_layers` layers.

    `teacher_fingerprint` identifies the teacher the student was made from (`kinfolk.plugins.adapt.checkpoint.
    input_fingerprint`); like `rule`, it is a record, not part of the partition, so two maps compare equal
    without it (a base's delta applies to a variant's student: same partition, other teachers).
    """

    teacher_num_layers: int
    blocks: tuple[tuple[int, int], ...]
    rule: dict[str, Any] = field(default_factory=dict, compare=False)
    teacher_fingerprint: str | None = field(default=None, compare=False)

    def __post_init__(self):
        blocks = tuple((int(start), int(end)) for start, end in self.blocks)
        object.__setattr__(self, "blocks", blocks)
        expected_start = 0
        for index, (start, end) in enumerate(blocks):
            if start != expected_start or end <= start:
                raise LayerMapError(
                    f"block {index} = [{start}, {end}) does not continue the partition at layer {expected_start}"
                )
            expected_start = end
        if expected_start != self.teacher_num_layers:
            raise LayerMapError(
                f"the blocks cover teacher layers 0..{expected_start - 1} but the teacher has "
                f"{self.teacher_num_layers} layers"
            )

    @property
    def num_student_layers(self) -> int:
        return len(self.blocks)

    @property
    def kept_layers(self) -> list[int]:
        """Teacher layer each student layer is initialised from (the first layer of its block)."""
        return [start for start, _ in self.blocks]

    @property
    def aligned_teacher_layers(self) -> list[int]:
        """Teacher layer whose output each student layer is trained to match (the last layer of its block)."""
        return [end - 1 for _, end in self.blocks]

    def describe(self) -> str:
        return f"{self.num_student_layers} student layers from {self.teacher_num_layers}: {list(self.blocks)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "version": 1,
            "teacher_num_layers": self.teacher_num_layers,
            "blocks": [list(block) for block in self.blocks],
            "rule": self.rule,
            **({"teacher_fingerprint": self.teacher_fingerprint} if self.teacher_fingerprint else {}),
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LayerMap:
        if not isinstance(values, dict) or values.get("format") != _FORMAT:
            found = values.get("format") if isinstance(values, dict) else type(values).__name__
            raise LayerMapError(f"not a kinfolk layer map (format {found!r}, expected {_FORMAT!r})")
        try:
            num_layers, blocks = int(values["teacher_num_layers"]), tuple(map(tuple, values["blocks"]))
        except KeyError as error:
            raise LayerMapError(f"the layer map has no {error.args[0]!r}") from None
        except (TypeError, ValueError) as error:
            raise LayerMapError(f"the layer map's teacher_num_layers / blocks are malformed ({error})") from None
        return cls(num_layers, blocks, values.get("rule", {}), values.get("teacher_fingerprint"))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / LAYER_MAP_FILE
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> LayerMap:
        """Read a layer map from its JSON file or from a model directory that holds one; errors name the file."""
        path = Path(path)
        if path.is_dir():
            path = path / LAYER_MAP_FILE
        try:
            values = json.loads(path.read_text())
        except FileNotFoundError:
            raise MissingInputError(f"the layer map {path} does not exist", path=path) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise CorruptFileError(f"the layer map {path} is not valid JSON ({error})", path=path) from None
        try:
            return cls.from_dict(values)
        except LayerMapError as error:
            raise LayerMapError(f"{path}: {error}", path=path) from None

    @classmethod
    def find(cls, directory: str | Path) -> LayerMap | None:
        """The layer map saved in a model directory, or None if it has none."""
        path = Path(directory) / LAYER_MAP_FILE
        return cls.load(path) if path.exists() else None
