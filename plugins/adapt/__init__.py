"""ADAPT merges: student init, weight-delta transfer, patching to every size and interpolation.

Plan-then-execute, as mergekit: a typed config (`config`) becomes a plan of output tensors and their sources
(`plan`), checked against the inputs' headers before anything is written, then streamed to a sharded,
atomically renamed output (`execute`). `cosine` compares two deltas (a diagnostic, not a merge). The command line
is `kinfolk merge <op> CONFIG.yaml --out DIR` (`kinfolk.commands.merge`).

Its names are imported on first use, so that the merge configs (`config`) load without torch (`kinfolk merge
--help`).
"""

from kinfolk.lazy import lazy_exports

# imported when one of their names is first asked for (`kinfolk.lazy`)
_EXPORTS = {
    "kinfolk.errors": ("TeacherMismatchError",),
    "kinfolk.plugins.adapt.api": ("merge",),
    "kinfolk.plugins.adapt.checkpoint": (
        "Checkpoint",
        "CheckpointError",
        "LayerMapMismatchError",
        "TensorMismatchError",
    ),
    "kinfolk.plugins.adapt.config": (
        "ApplyDeltaConfig",
        "DeltaConfig",
        "DeltaCosineConfig",
        "InitStudentConfig",
        "InterpolateConfig",
        "MergeConfigError",
        "PatchConfig",
        "load_config",
    ),
    "kinfolk.plugins.adapt.cosine": ("delta_cosine", "write_delta_cosine"),
    "kinfolk.plugins.adapt.execute": ("MergeError",),
    "kinfolk.plugins.adapt.layer_map": ("LAYER_MAP_FILE", "LayerMap", "LayerMapError", "LayerSelection"),
    "kinfolk.plugins.adapt.plan": ("MergePlan", "build_plan"),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
