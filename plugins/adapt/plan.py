"""Merge plans: every output tensor of every output model, written down as a weighted sum of input tensors.

All ADAPT operations are linear in the weights, so one recipe type covers them:

    init-student   student.layers.i.*   = teacher.layers.{a_i}.*              (a_i: first layer of block i)
    delta          Δ.*                  = distilled.* - init.*
    apply-delta    out.*                = init.* + alpha * Δ.*
    interpolate    out.*                = (1 - alpha) * a.* + alpha * b.*
    patch          out.layers.j.*       = teacher.layers.t.*  for every layer t of a patched block,
                                          student.layers.i.*  for an unpatched student layer i, in order

and patching takes the embeddings from the model supplying the first layer, the final norm and LM head from the one
supplying the last (untying a tied head, once said, when those models' tied matrices differ). A plan opens the
inputs' headers only (names, shapes, dtypes, layer maps: a bad config fails before any tensor is read);
`describe()` prints what would be written (`kinfolk merge ... --dry-run`).

>>> from kinfolk.plugins.adapt.plan import PlannedTensor, Term
>>> PlannedTensor("lm_head.weight", (Term("init", "lm_head.weight"), Term("delta", "lm_head.weight", 0.5)), (8, 4), "F32")
PlannedTensor(lm_head.weight = init[lm_head.weight] + 0.5·delta[lm_head.weight])
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import re
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig

from kinfolk.errors import LayerMapMismatchError, TeacherMismatchError
from kinfolk.hints import suggest
from kinfolk.layout import UnsupportedArchitectureError, select_layers_config
from kinfolk.plugins.adapt.checkpoint import (
    DELTA_FORMAT,
    DTYPE_NAMES,
    PROVENANCE_FILE,
    Checkpoint,
    compare_manifests,
    same_layer_map,
)
from kinfolk.plugins.adapt.config import (
    ApplyDeltaConfig,
    DeltaConfig,
    InitStudentConfig,
    InterpolateConfig,
    MergeConfig,
    MergeConfigError,
    PatchConfig,
)
from kinfolk.plugins.adapt.layer_map import LAYER_MAP_FILE, LayerMap, LayerMapError

ALL_SIZES_HINT = suggest("--all", "merge patch")  # `kinfolk merge patch --all`: every size

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Term:
    """`weight` times tensor `tensor` of the input named `source`."""

    source: str
    tensor: str
    weight: float = 1.0

    def __str__(self) -> str:
        prefix = "" if self.weight == 1 else "-" if self.weight == -1 else f"{self.weight:g}·"
        return f"{prefix}{self.source}[{self.tensor}]"


@dataclass(frozen=True)
class PlannedTensor:
    """Output tensor `name` = sum of `terms`, of `shape`, written as safetensors dtype `dtype` ("F32", "BF16", ...)."""

    name: str
    terms: tuple[Term, ...]
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _ITEM_SIZE[self.dtype]

    def formula(self) -> str:
        return f"{self.name} = " + " + ".join(map(str, self.terms)).replace("+ -", "- ")

    def __repr__(self) -> str:
        return f"PlannedTensor({self.formula()})"


_ITEM_SIZE = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass
class ModelPlan:
    """One output checkpoint: its tensors, its config (None for a delta) and the files that go beside it."""

    tensors: list[PlannedTensor]
    config: PretrainedConfig | None
    donor: str | None  # input whose tokenizer, generation config and other small files are copied
    layer_map: LayerMap | None
    subdir: str = ""  # "" = the output directory itself; patch --all writes one subdirectory per size
    metadata: dict[str, str] = field(default_factory=dict)  # safetensors header metadata
    files: dict[str, Any] = field(default_factory=dict)  # extra JSON files to write, by name
    summary: dict[str, Any] = field(default_factory=dict)  # what this model is (for provenance and family.json)

    @property
    def nbytes(self) -> int:
        return sum(tensor.nbytes for tensor in self.tensors)


@dataclass
class MergePlan:
    config: MergeConfig
    inputs: dict[str, Checkpoint]
    models: list[ModelPlan]

    @property
    def op(self) -> str:
        return self.config.op

    def describe(self, out: str | Path | None = None, every_tensor: bool = False) -> str:
        """The plan as text: inputs, then each output model (under `out`) with its tensors counted by the inputs
        they come from, or with `every_tensor` each tensor's formula."""
        lines = [f"kinfolk merge {self.op}"]
        lines += [f"  input {role}: {checkpoint.path}" for role, checkpoint in self.inputs.items()]
        for model in self.models:
            where = Path(out or ".") / model.subdir if model.subdir else Path(out or ".")
            lines.append(f"  output {where}: {len(model.tensors)} tensors, {model.nbytes / 1e6:.1f} MB")
            # a check's result rather than its whole record, so each summary value fits a short line
            brief = {key: value.get("result", value) if isinstance(value, dict) else value
                     for key, value in model.summary.items()}  # fmt: skip
            details = "; ".join(f"{key} {value}" for key, value in brief.items())
            lines += textwrap.wrap(details, width=100, initial_indent="    ", subsequent_indent="      ")
            if every_tensor:
                lines += [f"    {tensor.formula()}" for tensor in model.tensors]
                continue
            sources = Counter(" + ".join(str(term.source) if term.weight == 1 else f"{term.weight:g}·{term.source}"
                                         for term in tensor.terms) for tensor in model.tensors)  # fmt: skip
            lines += [f"    {count} tensors from {source}" for source, count in sources.most_common()]
        return "\n".join(lines)


def natural_key(name: str) -> list[Any]:
    """Sort `model.layers.2.*` before `model.layers.10.*`, so shards hold layers in order."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _output_dtype(config: MergeConfig, source_dtype: str) -> str:
    """The configured dtype for floating-point tensors, else the source's."""
    if config.torch_dtype is None or source_dtype not in ("F64", "F32", "BF16", "F16"):
        return source_dtype
    return DTYPE_NAMES[config.torch_dtype]


def _elementwise(config: MergeConfig, donor: Checkpoint, weights: dict[str, float]) -> list[PlannedTensor]:
    """Tensors that are the same weighted sum of the same-named tensor of each input."""
    return [
        PlannedTensor(
            name,
            tuple(Term(role, name, weight) for role, weight in weights.items()),
            shape,
            _output_dtype(config, dtype),
        )
        for name, (shape, dtype) in sorted(donor.manifest.items(), key=lambda item: natural_key(item[0]))
    ]


def _with_dtype(config: PretrainedConfig, merge_config: MergeConfig) -> PretrainedConfig:
    if merge_config.dtype is not None:
        config.dtype = merge_config.dtype
    return config


def plan_init_student(config: InitStudentConfig) -> MergePlan:
    teacher = Checkpoint.open_model("teacher", config.teacher)
    try:
        layer_map = config.layers.resolve(teacher.layout.num_layers)
    except LayerMapError as error:
        raise MergeConfigError(f"init-student: field 'layers': {error} (teacher {teacher.path})") from None
    # Recorded with the student, so that patching can later check it is given this very teacher.
    layer_map = dataclasses.replace(layer_map, teacher_fingerprint=teacher.fingerprint)
    student_index = {teacher_layer: index for index, teacher_layer in enumerate(layer_map.kept_layers)}
    tensors = []
    for name, (shape, dtype) in teacher.manifest.items():
        layer = teacher.layout.layer_of(name)
        if layer is not None and layer not in student_index:
            continue
        output = name if layer is None else teacher.layout.rename_layer(name, student_index[layer])
        tensors.append(PlannedTensor(output, (Term("teacher", name),), shape, _output_dtype(config, dtype)))
    tensors.sort(key=lambda tensor: natural_key(tensor.name))
    student_config = _with_dtype(select_layers_config(teacher.config, layer_map.kept_layers), config)
    summary = {"num_layers": layer_map.num_student_layers, "blocks": [list(block) for block in layer_map.blocks]}
    model = ModelPlan(tensors, student_config, "teacher", layer_map, summary=summary)
    return MergePlan(config, {"teacher": teacher}, [model])


def plan_delta(config: DeltaConfig) -> MergePlan:
    init = Checkpoint.open_model("init", config.init)
    distilled = Checkpoint.open_model("distilled", config.distilled)
    compare_manifests("delta", "init", init.manifest, "distilled", distilled.manifest, config.strict_dtypes)
    # A distilled student saved by another trainer may lack the map; the init's then stands for both.
    layer_map = same_layer_map("delta", init, distilled, allow_one_missing=True)
    tensors = _elementwise(config, init, {"distilled": 1.0, "init": -1.0})
    info = {
        "format": DELTA_FORMAT,
        "version": 1,
        "layer_map": layer_map.to_dict() if layer_map else None,
        # What the delta applies to: apply-delta checks a variant's init against these names, shapes and dtypes.
        "base": {name: [list(shape), dtype] for name, (shape, dtype) in init.manifest.items()},
        "config": init.config.to_dict(),
    }
    metadata = {"kinfolk_adapt": "delta", "adapt_layer_map": layer_map.to_json() if layer_map else ""}
    model = ModelPlan(tensors, None, None, None, metadata=metadata, files={"adapt_delta.json": info})
    return MergePlan(config, {"init": init, "distilled": distilled}, [model])


def plan_apply_delta(config: ApplyDeltaConfig) -> MergePlan:
    init = Checkpoint.open_model("init", config.init)
    delta = Checkpoint.open_delta("delta", config.delta)
    same_layer_map("apply-delta", delta, init)
    base = {name: (tuple(shape), dtype) for name, (shape, dtype) in delta.delta_info["base"].items()}
    compare_manifests("apply-delta", "delta", base, "init", init.manifest, config.strict_dtypes)
    compare_manifests("apply-delta", "the delta's base", base, "its tensors", delta.manifest, check_dtype=False)
    tensors = _elementwise(config, init, {"init": 1.0, "delta": config.alpha})
    model_config = _with_dtype(init.config, config)
    model = ModelPlan(tensors, model_config, "init", init.layer_map, summary={"alpha": config.alpha})
    return MergePlan(config, {"init": init, "delta": delta}, [model])


def plan_interpolate(config: InterpolateConfig) -> MergePlan:
    a = Checkpoint.open_model("a", config.a)
    b = Checkpoint.open_model("b", config.b)
    compare_manifests("interpolate", "a", a.manifest, "b", b.manifest, config.strict_dtypes)
    layer_map = same_layer_map("interpolate", a, b, allow_one_missing=True)
    tensors = _elementwise(config, a, {"a": 1.0 - config.alpha, "b": config.alpha})
    model = ModelPlan(tensors, _with_dtype(a.config, config), "a", layer_map, summary={"alpha": config.alpha})
    return MergePlan(config, {"a": a, "b": b}, [model])


# ---------------------------------------------------------------------------------------------------------------
# Patching


def _patch_inputs(config: PatchConfig) -> tuple[Checkpoint, Checkpoint, LayerMap, dict[str, Any]]:
    teacher = Checkpoint.open_model("teacher", config.teacher)
    student = Checkpoint.open_model("student", config.student)
    layer_map = _patch_layer_map(config, student)
    if layer_map is None:
        raise MergeConfigError(
            f"patch: the student {student.path} has no adapt_layer_map.json; set layer_map: to the map it was "
            "initialised with"
        )
    if teacher.layout.model_type != student.layout.model_type:
        raise MergeConfigError(
            f"patch: the teacher is {teacher.layout.model_type} but the student is {student.layout.model_type}"
        )
    if layer_map.teacher_num_layers != teacher.layout.num_layers:
        raise LayerMapError(
            f"patch: the layer map partitions {layer_map.teacher_num_layers} teacher layers but the teacher "
            f"{teacher.path} has {teacher.layout.num_layers}"
        )
    if layer_map.num_student_layers != student.layout.num_layers:
        raise LayerMapError(
            f"patch: the layer map has {layer_map.num_student_layers} student layers but the student "
            f"{student.path} has {student.layout.num_layers}"
        )
    # Each student layer must have the shape of the teacher layer it was initialised from.
    for index, teacher_layer in enumerate(layer_map.kept_layers):
        student_layer = {
            student.layout.rename_layer(name, teacher_layer): student.manifest[name]
            for name in student.layer_tensors(index)
        }
        teacher_block_start = {name: teacher.manifest[name] for name in teacher.layer_tensors(teacher_layer)}
        compare_manifests(
            "patch",
            f"teacher layer {teacher_layer}",
            teacher_block_start,
            f"student layer {index}",
            student_layer,
            config.strict_dtypes,
        )
    teacher_ends = {name: teacher.manifest[name] for name in teacher.non_layer_tensors()}
    student_ends = {name: student.manifest[name] for name in student.non_layer_tensors()}
    compare_manifests("patch", "teacher", teacher_ends, "student", student_ends, config.strict_dtypes)
    # Last, as it reads the whole teacher (the structural checks above name a wrong input more precisely).
    return teacher, student, layer_map, check_teacher(config, teacher, student, layer_map)


def _patch_layer_map(config: PatchConfig, student: Checkpoint) -> LayerMap | None:
    """The configured layer map, which must be the student's own when the student has one."""
    if not config.layer_map:
        return student.layer_map
    given = LayerMap.load(config.layer_map)
    if student.layer_map is None:
        return given  # the file stands in for the map the student lacks
    if given != student.layer_map:
        raise LayerMapMismatchError(
            f"patch: field 'layer_map' {config.layer_map} ({given.describe()}) is not the layer map the student "
            f"{student.path} was made with ({student.layer_map.describe()}, in its {LAYER_MAP_FILE}); leave "
            "layer_map unset to use the student's own",
            path=config.layer_map,
        )
    return student.layer_map


def check_teacher(config: PatchConfig, teacher: Checkpoint, student: Checkpoint, layer_map: LayerMap) -> dict:
    """Refuse a teacher other than the one the student was initialised from, unless `allow_other_teacher`.

    The fingerprint recorded at init-student (in the student's layer map, or an init-student output's
    `kinfolk_merge.json`) is compared with the given teacher's. Returns what was checked, for the provenance.
    """
    recorded, source = student.recorded_teacher_fingerprint()
    if recorded is None and layer_map.teacher_fingerprint:
        recorded, source = layer_map.teacher_fingerprint, Path(config.layer_map)
    actual = teacher.fingerprint
    check = {"recorded": recorded, "recorded_in": str(source) if source else None, "teacher": actual}
    if recorded == actual:
        return {**check, "result": "match"}
    if config.allow_other_teacher:
        return {**check, "result": "overridden by allow_other_teacher"}
    override = "set allow_other_teacher: true to patch anyway (stated in the output's provenance)"
    if recorded is None:
        raise TeacherMismatchError(
            f"patch: the student {student.path} records no teacher fingerprint (no teacher_fingerprint in its "
            f"{LAYER_MAP_FILE} and no init-student {PROVENANCE_FILE}), so the teacher {teacher.path} cannot be "
            f"checked; {override}",
            path=student.path,
        )
    raise TeacherMismatchError(
        f"patch: the teacher {teacher.path} ({actual}) is not the teacher the student {student.path} was "
        f"initialised from ({recorded}, recorded in {source}); if it is the same model re-saved, or a cross-patch "
        f"is intended, {override}",
        path=teacher.path,
    )


def patched_sets(config: PatchConfig, num_student_layers: int, all_sizes: bool) -> list[tuple[int, ...]]:
    """The student layers to patch, per output model: k = 0..M in `order` with --all, else the configured ones."""
    front_to_back = config.order == "front-to-back"

    def first(k: int) -> tuple[int, ...]:
        return tuple(range(k)) if front_to_back else tuple(range(num_student_layers - k, num_student_layers))

    if all_sizes:
        return [first(k) for k in range(num_student_layers + 1)]
    if config.patched_layers is not None:
        outside = [index for index in config.patched_layers if not 0 <= index < num_student_layers]
        if outside or len(set(config.patched_layers)) != len(config.patched_layers):
            raise MergeConfigError(
                f"patch: field 'patched_layers' must list distinct student layers in 0..{num_student_layers - 1}, "
                f"got {list(config.patched_layers)}"
            )
        return [tuple(sorted(config.patched_layers))]
    if config.num_patched is None:
        raise MergeConfigError(
            f"patch: set num_patched (with order) or patched_layers, or pass {ALL_SIZES_HINT} for every size"
        )
    if config.num_patched > num_student_layers:
        raise MergeConfigError(
            f"patch: field 'num_patched' is {config.num_patched} but the student has only {num_student_layers} layers"
        )
    return [first(config.num_patched)]


def _patched_model(
    config: PatchConfig,
    teacher: Checkpoint,
    student: Checkpoint,
    layer_map: LayerMap,
    patched: tuple[int, ...],
    teacher_check: dict[str, Any],
    same_ends: Callable[[str, str], bool],
) -> ModelPlan:
    layout = teacher.layout
    sources = {"teacher": teacher, "student": student}
    tensors: list[PlannedTensor] = []

    def add(output: str, role: str, name: str, dtype_like: str) -> None:
        shape, _ = sources[role].manifest[name]
        dtype = _output_dtype(config, teacher.manifest[dtype_like][1])
        tensors.append(PlannedTensor(output, (Term(role, name),), shape, dtype))

    # Decoder layers, in order: a patched student layer becomes its whole teacher block.
    teacher_layers, blocks = [], []
    for index, (start, end) in enumerate(layer_map.blocks):
        if index in patched:
            pieces = [("teacher", layer, layer) for layer in range(start, end)]
            blocks += [(layer, layer + 1) for layer in range(start, end)]
        else:
            pieces = [("student", index, start)]
            blocks.append((start, end))
        for role, source_layer, teacher_layer in pieces:
            output_layer = len(teacher_layers)
            teacher_layers.append(teacher_layer)
            for name in sources[role].layer_tensors(source_layer):
                like = layout.rename_layer(name, teacher_layer)
                add(layout.rename_layer(name, output_layer), role, name, like)

    # The ends: embeddings follow the first layer, final norm and LM head follow the last.
    front = "teacher" if 0 in patched else "student"
    back = "teacher" if layer_map.num_student_layers - 1 in patched else "student"
    head = f"{layout.lm_head}.weight"
    for name in teacher.non_layer_tensors():
        if name.startswith(layout.embeddings + "."):
            add(name, front, name, name)
        elif name.startswith((layout.final_norm + ".", layout.lm_head + ".")):
            add(name, back, name, name)
        else:
            raise UnsupportedArchitectureError(
                f"patch: tensor {name!r} is neither a decoder layer nor the embeddings, final norm or LM head, so "
                "it is unclear which end of the patched model it belongs to"
            )
    # Ends from different models can stay tied where the two models' tied matrices are equal (a student that kept
    # the teacher's embeddings); else the head gets its own tensor.
    untie = layout.tied_embeddings and front != back and not same_ends(front, back)
    if untie and head not in teacher.manifest:
        # The two ends come from different models: the head can no longer share the input embeddings.
        add(head, back, sources[back].head_tensor(), sources[back].head_tensor())
    tensors.sort(key=lambda tensor: natural_key(tensor.name))

    model_config = _with_dtype(select_layers_config(teacher.config, teacher_layers), config)
    if untie:
        model_config.tie_word_embeddings = False
    summary = {
        "k": len(patched),
        "patched_student_layers": list(patched),
        "num_layers": len(teacher_layers),
        "teacher_layers": teacher_layers,
        "embeddings_from": front,
        "head_from": back,
        "tied_embeddings": layout.tied_embeddings and not untie,
        "untied_head": untie,
        "teacher_check": teacher_check,
    }
    return ModelPlan(
        tensors,
        model_config,
        "teacher",
        # The patched model is itself a student of the teacher: a patched block is a run of one-layer blocks.
        LayerMap(
            layer_map.teacher_num_layers, tuple(blocks), {"patched_from": list(layer_map.blocks)}, teacher.fingerprint
        ),
        summary=summary,
    )


def plan_patch(config: PatchConfig, all_sizes: bool = False) -> MergePlan:
    teacher, student, layer_map, teacher_check = _patch_inputs(config)
    sources = {"teacher": teacher, "student": student}

    @functools.cache
    def same_ends(front: str, back: str) -> bool:
        """Whether `front`'s input embeddings equal `back`'s LM head, so that a model taking its embeddings from
        one and its head from the other can keep them tied."""
        embeddings = f"{teacher.layout.embeddings}.weight"
        return torch.equal(
            sources[front].reader.get(embeddings), sources[back].reader.get(sources[back].head_tensor())
        )

    models = []
    sets = patched_sets(config, layer_map.num_student_layers, all_sizes)
    width = len(str(layer_map.num_student_layers))
    for patched in sets:
        model = _patched_model(config, teacher, student, layer_map, patched, teacher_check, same_ends)
        if all_sizes:
            model.subdir = f"k{len(patched):0{width}d}"
        models.append(model)
    untied = [model for model in models if model.summary["untied_head"]]
    if untied:
        front, back = untied[0].summary["embeddings_from"], untied[0].summary["head_from"]
        logger.warning(
            f"patch: {len(untied)} of {len(models)} output models get their own LM head ({untied[0].nbytes / 1e6:.0f} "
            f"MB with it): their embeddings come from the {front} and their head from the {back}, whose tied "
            "embedding matrices differ"
        )
    return MergePlan(config, sources, models)


def build_plan(config: MergeConfig, all_sizes: bool = False) -> MergePlan:
    """The plan of any writing operation from its typed config."""
    if all_sizes and not isinstance(config, PatchConfig):
        raise MergeConfigError(f"{config.op}: --all applies to patch only")
    if isinstance(config, PatchConfig):
        return plan_patch(config, all_sizes)
    builders = {
        InitStudentConfig: plan_init_student,
        DeltaConfig: plan_delta,
        ApplyDeltaConfig: plan_apply_delta,
        InterpolateConfig: plan_interpolate,
    }
    return builders[type(config)](config)
