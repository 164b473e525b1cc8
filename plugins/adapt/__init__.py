"""ADAPT merges: student init, weight-delta transfer, patching to every size and interpolation.

Plan-then-execute, as mergekit: a typed config (`config`) becomes a plan of output tensors and their sources
(`plan`), checked against the inputs' headers before anything is written, then streamed to a sharded,
atomically renamed output (`execute`). `cosine` compares two deltas (a diagnostic, not a merge). The command line
is `kinfolk merge <op> CONFIG.yaml --out DIR` (`kinfolk.commands.merge`).
"""

from kinfolk.errors import TeacherMismatchError
from kinfolk.plugins.adapt.api import merge
from kinfolk.plugins.adapt.checkpoint import (
    Checkpoint,
    CheckpointError,
    LayerMapMismatchError,
    TensorMismatchError,
)
from kinfolk.plugins.adapt.config import (
    ApplyDeltaConfig,
    DeltaConfig,
    DeltaCosineConfig,
    InitStudentConfig,
    InterpolateConfig,
    MergeConfigError,
    PatchConfig,
    load_config,
)
from kinfolk.plugins.adapt.cosine import delta_cosine, write_delta_cosine
from kinfolk.plugins.adapt.execute import MergeError
from kinfolk.plugins.adapt.layer_map import LAYER_MAP_FILE, LayerMap, LayerMapError, LayerSelection
from kinfolk.plugins.adapt.plan import MergePlan, build_plan

__all__ = [
    "LAYER_MAP_FILE",
    "ApplyDeltaConfig",
    "Checkpoint",
    "CheckpointError",
    "DeltaConfig",
    "DeltaCosineConfig",
    "InitStudentConfig",
    "InterpolateConfig",
    "LayerMap",
    "LayerMapError",
    "LayerMapMismatchError",
    "LayerSelection",
    "MergeConfigError",
    "MergeError",
    "MergePlan",
    "PatchConfig",
    "TeacherMismatchError",
    "TensorMismatchError",
    "build_plan",
    "delta_cosine",
    "load_config",
    "merge",
    "write_delta_cosine",
]
