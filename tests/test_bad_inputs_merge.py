"""ADAPT merges refuse inputs they cannot prove belong together, and name corrupt or missing files.

Each case asserts the specific error, a one-line message naming the culprit, nothing at (or beside) the
destination, and the inputs untouched (`refusal_helpers.assert_refused`).
"""

import json
import shutil

import pytest
import torch
from adapt_helpers import init_student
from refusal_helpers import assert_refused

from kinfolk.errors import (
    CheckpointError,
    CorruptFileError,
    InputError,
    LayerMapError,
    LayerMapMismatchError,
    MissingInputError,
    TeacherMismatchError,
)
from kinfolk.plugins.adapt import LAYER_MAP_FILE, LayerMap, MergeConfigError, merge
from kinfolk.tensors import TensorReader


@pytest.fixture(scope="module")
def students(tiny_kit, tmp_path_factory):
    """A 4-layer teacher; two 2-layer students of it on different maps; an unrelated teacher of the same shape."""
    root = tmp_path_factory.mktemp("merge-inputs")
    teacher = tiny_kit.model_dir("qwen3", "large")
    every = init_student(teacher, root / "every", every=2)
    listed = init_student(teacher, root / "listed", layers=[0, 1])
    return {
        "teacher": teacher,
        "every": every,
        "listed": listed,
        "stranger": tiny_kit.model_dir("qwen3", "large", seed=1),
        "root": root,
    }


def copy_without(source, out, *names):
    """A copy of a model directory without the named files."""
    shutil.copytree(source, out, ignore=shutil.ignore_patterns(*names))
    return out


def map_without_teacher_record(source, out, *also_without):
    """A copy of a student whose layer map predates the teacher record (and without `also_without` files)."""
    copy = copy_without(source, out, LAYER_MAP_FILE, *also_without)
    values = LayerMap.load(source).to_dict()
    del values["teacher_fingerprint"]
    (copy / LAYER_MAP_FILE).write_text(json.dumps(values))
    return copy


def patch(students, student="every", **fields):
    return {"op": "patch", "teacher": str(students["teacher"]), "student": str(students[student]), **fields}


# --- the layer map given to patch must be the student's own ------------------------------------------------------


def test_patch_refuses_the_layer_map_of_another_student_of_the_same_depth(students, tmp_path):
    config = patch(students, layer_map=str(students["listed"] / LAYER_MAP_FILE), num_patched=1)
    assert_refused(
        lambda: merge(config, tmp_path / "out", progress=False),
        LayerMapMismatchError,
        students["listed"] / LAYER_MAP_FILE,
        "(0, 1), (1, 4)",  # the given map
        "(0, 2), (2, 4)",  # the student's own
        destination=tmp_path / "out",
        inputs=[students["every"], students["listed"]],
    )


def test_patch_accepts_the_students_own_layer_map_and_a_map_for_a_student_without_one(students, tmp_path):
    own = merge(patch(students, layer_map=str(students["every"] / LAYER_MAP_FILE), num_patched=1), tmp_path / "a")
    bare = copy_without(students["every"], tmp_path / "bare", LAYER_MAP_FILE)
    config = {**patch(students, num_patched=1), "student": str(bare), "layer_map": str(students["every"])}
    given = merge(config, tmp_path / "b", progress=False)
    assert LayerMap.load(own) == LayerMap.load(given)
    for name in TensorReader(own).names():
        assert torch.equal(TensorReader(own).get(name), TensorReader(given).get(name)), name


# --- the teacher must be the one the student was initialised from ----------------------------------------------


def test_patch_refuses_an_unrelated_teacher_of_the_same_shape(students, tmp_path):
    config = {**patch(students, num_patched=1), "teacher": str(students["stranger"])}
    error = assert_refused(
        lambda: merge(config, tmp_path / "out", progress=False),
        TeacherMismatchError,
        students["stranger"],
        students["every"],
        "allow_other_teacher",
        destination=tmp_path / "out",
        inputs=[students["every"], students["stranger"]],
    )
    assert error.path == str(students["stranger"])


def test_allow_other_teacher_overrides_and_is_stated_in_the_provenance(students, tmp_path):
    config = {**patch(students, num_patched=1), "teacher": str(students["stranger"]), "allow_other_teacher": True}
    out = merge(config, tmp_path / "out", progress=False)
    provenance = json.loads((out / "kinfolk_merge.json").read_text())
    check = provenance["output"]["teacher_check"]
    assert provenance["config"]["allow_other_teacher"] is True
    assert check["result"] == "overridden by allow_other_teacher"
    assert check["recorded"] == LayerMap.load(students["every"]).teacher_fingerprint != check["teacher"]
    assert check["teacher"] == provenance["inputs"]["teacher"]["fingerprint"]


def test_a_copy_of_the_same_teacher_is_accepted_and_the_match_recorded(students, tmp_path):
    copy = shutil.copytree(students["teacher"], tmp_path / "teacher-copy")
    out = merge({**patch(students, num_patched=1), "teacher": str(copy)}, tmp_path / "out", progress=False)
    check = json.loads((out / "kinfolk_merge.json").read_text())["output"]["teacher_check"]
    assert check["result"] == "match" and check["recorded_in"] == str(students["every"] / LAYER_MAP_FILE)
    assert LayerMap.load(out).teacher_fingerprint == check["teacher"]  # a patched model is a student of it too


def test_a_student_whose_map_predates_the_record_is_checked_against_its_merge_record(students, tmp_path):
    old = map_without_teacher_record(students["every"], tmp_path / "old")
    out = merge({**patch(students, num_patched=1), "student": str(old)}, tmp_path / "ok", progress=False)
    check = json.loads((out / "kinfolk_merge.json").read_text())["output"]["teacher_check"]
    assert check["result"] == "match" and check["recorded_in"] == str(old / "kinfolk_merge.json")
    config = {**patch(students, num_patched=1), "student": str(old), "teacher": str(students["stranger"])}
    assert_refused(
        lambda: merge(config, tmp_path / "out", progress=False),
        TeacherMismatchError,
        old / "kinfolk_merge.json",
        destination=tmp_path / "out",
    )


def test_a_student_with_no_teacher_record_is_refused_unless_overridden(students, tmp_path):
    bare = map_without_teacher_record(students["every"], tmp_path / "bare", "kinfolk_merge.json")
    config = {**patch(students, num_patched=1), "student": str(bare)}
    assert_refused(
        lambda: merge(config, tmp_path / "out", progress=False),
        TeacherMismatchError,
        "records no teacher fingerprint",
        bare,
        destination=tmp_path / "out",
        inputs=[bare],
    )
    merge({**config, "allow_other_teacher": True}, tmp_path / "out", progress=False)


# --- layer selections are range-checked in every form ----------------------------------------------------------


@pytest.mark.parametrize(
    ("layers", "named"),
    [
        ({"first": 9}, "first: 9 is more than the teacher's 4 layers"),
        ({"last": 5}, "last: 5 is more than the teacher's 4 layers"),
        ({"every": 5}, "every: 5 is more than the teacher's 4 layers"),
        ({"every": 2, "first": 9}, "first: 9"),
        ({"layers": [0, 4]}, "[4] are outside the teacher's layers 0..3"),
        ({"layers": [0, -1]}, "[-1] are outside"),
        ({"layers": [0, 2, 1]}, "increasing order"),
        ({"layers": [0, 0]}, "twice"),
        ({"last": 2}, "not layer 0"),
        ({"first": 0}, "first: expected a positive integer, got 0"),
        ({"layers": []}, "the explicit list is empty"),
        ({"layers": [0, "2"]}, "expected a list of layer indices"),
        ({"every": 2, "layers": [0]}, "cannot be combined"),
        ({"evry": 2}, "unknown layer-selection key"),
    ],
)
def test_init_student_refuses_a_selection_outside_the_teacher(students, tmp_path, layers, named):
    config = {"op": "init-student", "teacher": str(students["teacher"]), "layers": layers}
    assert_refused(
        lambda: merge(config, tmp_path / "student", progress=False),
        MergeConfigError,
        "field 'layers'",
        named,
        destination=tmp_path / "student",
        inputs=[students["teacher"]],
    )


def test_the_largest_in_range_selections_are_accepted(students, tmp_path):
    for index, layers in enumerate(({"first": 4}, {"last": 4}, {"every": 4})):
        out = merge(
            {"op": "init-student", "teacher": str(students["teacher"]), "layers": layers}, tmp_path / f"{index}"
        )
        assert LayerMap.load(out).kept_layers == ([0] if "every" in layers else [0, 1, 2, 3])


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"patched_layers": [0, 2]}, "got [0, 2]"),
        ({"patched_layers": [1, 1]}, "distinct"),
        ({"patched_layers": [-1]}, "0..1"),
        ({"num_patched": 3}, "'num_patched' is 3 but the student has only 2"),
        ({"num_patched": -1}, "non-negative"),
        ({"num_patched": 1, "patched_layers": [0]}, "cannot be combined"),
    ],
)
def test_patch_refuses_student_layers_outside_the_student(students, tmp_path, fields, named):
    assert_refused(
        lambda: merge(patch(students, **fields), tmp_path / "out", progress=False),
        MergeConfigError,
        named,
        destination=tmp_path / "out",
    )


# --- corrupt and missing files are named -----------------------------------------------------------------------


def truncated_copy(source, out, file="model.safetensors", keep=0.5):
    shutil.copytree(source, out)
    data = (out / file).read_bytes()
    (out / file).write_bytes(data[: int(len(data) * keep)])
    return out


@pytest.mark.parametrize("keep", [0.0, 0.001, 0.5, 0.999])
def test_truncated_teacher_weights_are_named(students, tmp_path, keep):
    teacher = truncated_copy(students["teacher"], tmp_path / "teacher", keep=keep)
    config = {"op": "init-student", "teacher": str(teacher), "layers": {"every": 2}}
    error = assert_refused(
        lambda: merge(config, tmp_path / "student", progress=False),
        CorruptFileError,
        "teacher",
        teacher / "model.safetensors",
        destination=tmp_path / "student",
        inputs=[teacher],
    )
    assert error.path == str(teacher / "model.safetensors")


def test_truncated_delta_is_named(students, tmp_path):
    delta = merge({"op": "delta", "init": str(students["every"]), "distilled": str(students["every"])}, tmp_path / "d")
    broken = truncated_copy(delta, tmp_path / "broken")
    config = {"op": "apply-delta", "init": str(students["every"]), "delta": str(broken)}
    assert_refused(
        lambda: merge(config, tmp_path / "out", progress=False),
        CorruptFileError,
        "delta",
        broken / "model.safetensors",
        destination=tmp_path / "out",
    )
    (broken / "model.safetensors").write_bytes((delta / "model.safetensors").read_bytes())
    (broken / "adapt_delta.json").write_text('{"format": "kinfolk-adapt-delta", "config"')
    assert_refused(
        lambda: merge(config, tmp_path / "out", progress=False),
        CorruptFileError,
        broken / "adapt_delta.json",
        "not valid JSON",
        destination=tmp_path / "out",
    )


@pytest.mark.parametrize(
    ("content", "error", "named"),
    [
        ('{"format": "kinfolk-adapt-layer-map", "blocks": ', CorruptFileError, "not valid JSON"),
        ('{"format": "kinfolk-adapt-layer-map", "blocks": [[0, 2]]}', LayerMapError, "no 'teacher_num_layers'"),
        (
            '{"format": "kinfolk-adapt-layer-map", "teacher_num_layers": 4, "blocks": [[0, 2], [3, 4]]}',
            LayerMapError,
            "does not continue the partition",
        ),
        ('{"format": "something-else"}', LayerMapError, "not a kinfolk layer map"),
        (None, MissingInputError, "does not exist"),
    ],
)
def test_a_broken_layer_map_file_is_named(students, tmp_path, content, error, named):
    layer_map = tmp_path / "map.json"
    if content is not None:
        layer_map.write_text(content)
    bare = copy_without(students["every"], tmp_path / "bare", LAYER_MAP_FILE)
    config = {**patch(students, num_patched=1), "student": str(bare), "layer_map": str(layer_map)}
    assert_refused(
        lambda: merge(config, tmp_path / "out", progress=False),
        error,
        layer_map,
        named,
        destination=tmp_path / "out",
    )


def test_a_broken_config_json_is_named(students, tmp_path):
    student = shutil.copytree(students["every"], tmp_path / "student")
    (student / "config.json").write_text('{"model_type": "qwen3", ')
    assert_refused(
        lambda: merge(patch({**students, "every": student}, num_patched=1), tmp_path / "out", progress=False),
        CorruptFileError,
        "student",
        student / "config.json",
        destination=tmp_path / "out",
    )


@pytest.mark.parametrize("problem", ["missing", "file", "no-weights"])
def test_a_student_path_that_is_not_a_model_is_named(students, tmp_path, problem):
    student = tmp_path / "student"
    if problem == "file":
        student.write_text("not a directory")
    elif problem == "no-weights":
        copy_without(students["every"], student, "*.safetensors")
    error = assert_refused(
        lambda: merge(patch({**students, "every": student}, num_patched=1), tmp_path / "out", progress=False),
        InputError,
        "student",
        student,
        destination=tmp_path / "out",
    )
    assert isinstance(error, CheckpointError if problem != "no-weights" else MissingInputError)


def test_layer_map_comparison_ignores_the_teacher_record_so_deltas_transfer(students, tmp_path):
    """A base's delta applies to a variant's student: same partition, another teacher's fingerprint."""
    variant_init = merge(
        {"op": "init-student", "teacher": str(students["stranger"]), "layers": {"every": 2}}, tmp_path / "vi"
    )
    delta = merge({"op": "delta", "init": str(students["every"]), "distilled": str(students["every"])}, tmp_path / "d")
    out = merge({"op": "apply-delta", "init": str(variant_init), "delta": str(delta)}, tmp_path / "v", progress=False)
    assert LayerMap.load(out).teacher_fingerprint == LayerMap.load(variant_init).teacher_fingerprint
    assert LayerMap.load(variant_init).teacher_fingerprint != LayerMap.load(students["every"]).teacher_fingerprint
