"""A full disk: the verbs that write large outputs refuse before any work when the destination's file system has too
little space (one line with the destination, the bytes needed and free; exit 2), and a disk that fills during the
write (another writer) ends in one line naming the destination, the staging removed, nothing at `--out` (exit 1).

Free space is faked by patching `shutil.disk_usage` (a tmpfs needs root); the disk filling mid-way by a writer that
raises what safetensors' Rust writer and Python's `open().write` raise on ENOSPC.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import shutil
from pathlib import Path

import pytest
from refusal_helpers import assert_command_refused
from safetensors import SafetensorError, safe_open

from kinfolk.atomic import atomic_file, staging_owner
from kinfolk.commands import main
from kinfolk.diskspace import DiskFullError, format_bytes
from kinfolk.testing import prompt_completion_dataset

TOTAL = 10**12


def fake_free(monkeypatch, free: int) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(TOTAL, TOTAL - free, free))


def tensor_bytes(directory) -> int:
    """Bytes of every tensor in a written model, read back from its safetensors files (not from the plan)."""
    total = 0
    for path in directory.rglob("*.safetensors"):
        with safe_open(str(path), "pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                tensor = handle.get_tensor(name)
                total += tensor.numel() * tensor.element_size()
    return total


@pytest.fixture(scope="module")
def teacher(tiny_kit):
    return tiny_kit.model_dir("qwen3", "large")


@pytest.fixture(scope="module")
def init_config(teacher, tmp_path_factory):
    path = tmp_path_factory.mktemp("disk") / "init.yaml"
    path.write_text(json.dumps({"teacher": str(teacher), "layers": {"every": 2}, "max_shard_size": "30KB"}))
    return path


@pytest.fixture(scope="module")
def student_bytes(init_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("disk-reference") / "student"
    assert main(["merge", "init-student", str(init_config), "--out", str(out), "--no-progress"]) == 0
    return tensor_bytes(out)


@pytest.fixture
def no_merge_work(monkeypatch):
    """Fails the test if a merge computes a tensor: the refusal must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was computed before the free-space check")

    monkeypatch.setattr("kinfolk.plugins.adapt.execute.materialise", refuse)


def test_merge_refuses_before_any_work_when_the_plan_does_not_fit(
    init_config, student_bytes, tmp_path, monkeypatch, no_merge_work
):
    free = student_bytes - 1
    fake_free(monkeypatch, free)
    out = tmp_path / "student"
    line = assert_command_refused(
        ["merge", "init-student", init_config, "--out", out, "--no-progress"],
        str(out),
        f"needs {format_bytes(student_bytes)}",
        f"{format_bytes(free)} free",
        destination=out,
    )
    assert "not enough disk space" in line


def test_merge_fits_with_exactly_the_bytes_it_needs(init_config, student_bytes, tmp_path, monkeypatch):
    fake_free(monkeypatch, student_bytes)
    out = tmp_path / "student"
    assert main(["merge", "init-student", str(init_config), "--out", str(out), "--no-progress"]) == 0
    assert tensor_bytes(out) == student_bytes


@pytest.fixture(scope="module")
def student(teacher, tmp_path_factory):
    from adapt_helpers import init_student

    return init_student(teacher, tmp_path_factory.mktemp("disk-student") / "s", every=2)


def test_patch_all_refuses_with_the_size_of_every_model(teacher, student, tmp_path, monkeypatch, no_merge_work):
    config = tmp_path / "patch.yaml"
    config.write_text(json.dumps({"teacher": str(teacher), "student": str(student)}))
    fake_free(monkeypatch, 2 * tensor_bytes(student))  # room for two students, not for the 3 sizes of patch --all
    out = tmp_path / "family"
    assert_command_refused(
        ["merge", "patch", config, "--out", out, "--all", "--no-progress"], str(out), "3 models", destination=out
    )


def full_disk_after(monkeypatch, target: str, calls: int) -> None:
    """Make `target` (MODULE:ATTR) raise safetensors' ENOSPC error from its `calls`-th call on."""
    module_name, attribute = target.rsplit(":", 1)
    owner_name, _, name = attribute.rpartition(".")
    import importlib

    owner = importlib.import_module(module_name)
    for part in owner_name.split(".") if owner_name else []:
        owner = getattr(owner, part)
    real, seen = getattr(owner, name), []

    def filling(*args, **kwargs):
        seen.append(1)
        if len(seen) >= calls:
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, filling)


def run_quietly(argv: list[str]) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        status = main([str(argument) for argument in argv])
    return status, stderr.getvalue()


def test_a_disk_that_fills_during_a_merge_is_one_line_and_leaves_nothing(init_config, tmp_path, monkeypatch):
    full_disk_after(monkeypatch, "kinfolk.tensors:ShardedWriter._flush", 2)  # the second shard does not fit
    out = tmp_path / "student"
    status, text = run_quietly(["merge", "init-student", init_config, "--out", out, "--no-progress"])
    assert status == 1, text
    assert "Traceback" not in text
    lines = text.strip().splitlines()
    assert lines == [lines[-1]] and lines[-1].startswith(
        f"kinfolk merge: error: no space left on device while writing {out} "
    )
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if staging_owner(p) is not None] == []


def test_a_disk_that_fills_during_an_atomic_file_names_the_destination(tmp_path, monkeypatch):
    destination = tmp_path / "report.json"
    with pytest.raises(DiskFullError) as caught, atomic_file(destination) as handle:
        handle.write("{")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert caught.value.path == str(destination) and str(destination) in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_score_refuses_before_reading_its_data_when_the_output_does_not_fit(tiny_kit, tmp_path, monkeypatch):
    import kinfolk.data

    data = tmp_path / "train.jsonl"
    prompt_completion_dataset(30).to_json(str(data))
    needed = 2 * data.stat().st_size
    fake_free(monkeypatch, needed - 1)

    def refuse(*args, **kwargs):
        raise AssertionError("the data was read before the free-space check")

    monkeypatch.setattr(kinfolk.data, "load_data", refuse)  # `kinfolk score` imports it when it runs
    family = tiny_kit.family("qwen2")
    out = tmp_path / "scored.jsonl"
    models = ["--large_base", family["large_base"], "--small_base", family["small_base"]]
    assert_command_refused(
        ["score", "--data", data, "--out", out, "--cache_dir", tmp_path / "cache", *models],
        str(out),
        f"needs {format_bytes(needed)}",
        destination=out,
    )


def test_distil_refuses_before_launching_when_student_checkpoints_and_delta_do_not_fit(teacher, tmp_path, monkeypatch):
    from kinfolk.commands import distil

    data = tmp_path / "sft.jsonl"
    prompt_completion_dataset(8).to_json(str(data))
    out = tmp_path / "distilled"
    argv = ["--teacher", teacher, "--sft_data", data, "--out", out, "--use_cpu", "--max_steps", "10"]
    argv += ["--save_steps", "5", "--save_total_limit", "1"]
    student = tensor_bytes(Path(main_init(teacher, tmp_path)))
    needed = student * (3 + 3 * 2)  # init, distilled, delta; two checkpoints at once (the limit, one publishing)
    fake_free(monkeypatch, needed - 1)

    def refuse(*args, **kwargs):
        raise AssertionError("accelerate launch started before the free-space check")

    monkeypatch.setattr(distil, "launch", refuse)
    assert_command_refused(["distil", *argv], str(out), f"needs {format_bytes(needed)}", destination=out)


def test_sft_full_fine_tuning_refuses_before_launching_when_model_and_checkpoints_do_not_fit(
    tiny_kit, tmp_path, monkeypatch
):
    from transformers import AutoModelForCausalLM

    from kinfolk.commands import sft

    model = tiny_kit.model_dir("llama", "large")
    data = tmp_path / "train.jsonl"
    prompt_completion_dataset(8).to_json(str(data))
    out = tmp_path / "sft"
    argv = ["sft", "--model_name_or_path", model, "--dataset_name", data, "--output_dir", out, "--use_cpu"]
    argv += ["--max_steps", "10", "--save_steps", "5", "--save_total_limit", "1"]
    parameters = AutoModelForCausalLM.from_pretrained(model).num_parameters()
    needed = 4 * parameters * (1 + 3 * 2)  # the model; two checkpoints at once (weights, Adam's moments), fp32
    launched = []
    monkeypatch.setattr(sft, "launch", lambda *args: launched.append(args) or 0)
    fake_free(monkeypatch, needed - 1)
    assert_command_refused(argv, str(out), f"needs {format_bytes(needed)}", destination=out)
    assert not launched
    fake_free(monkeypatch, needed)
    assert main([str(a) for a in argv]) == 0 and len(launched) == 1
    # with an adapter the checkpoints are small beside the base: no estimate, no refusal
    fake_free(monkeypatch, 1)
    assert main([str(a) for a in [*argv, "--use_peft", "--output_dir", tmp_path / "lora"]]) == 0


def main_init(teacher, tmp_path) -> str:
    """The student `kinfolk distil`'s default layers give, written by the merge command (for its size)."""
    config = tmp_path / "init.yaml"
    config.write_text(json.dumps({"teacher": str(teacher), "layers": {"every": 2, "last": 1}}))
    out = tmp_path / "init-student"
    assert main(["merge", "init-student", str(config), "--out", str(out), "--no-progress"]) == 0
    return str(out)


def test_lab_build_refuses_before_training_when_the_family_does_not_fit(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from kinfolk.lab.world import family as family_module
    from kinfolk.lab.world.family import LabConfig
    from kinfolk.lab.world.members import model_config
    from kinfolk.lab.world.tokenizer import build_lab_tokenizer

    config, tokenizer = LabConfig.quick_config(seed=0), build_lab_tokenizer()
    saved = {}
    for shape in ("small_shape", "large_shape"):  # each shape's model built and saved for real
        directory = tmp_path / shape
        AutoModelForCausalLM.from_config(model_config(getattr(config, shape), tokenizer)).save_pretrained(directory)
        saved[shape] = tensor_bytes(directory)
    needed = 2 * saved["small_shape"] + 3 * saved["large_shape"]
    fake_free(monkeypatch, needed - 1)

    def refuse(*args, **kwargs):
        raise AssertionError("a model was trained before the free-space check")

    monkeypatch.setattr(family_module, "train", refuse)
    cache = tmp_path / "cache"
    root = cache / config.cache_key()
    assert_command_refused(
        ["lab", "build", "--quick", "--cache_dir", cache], str(root), f"needs {format_bytes(needed)}", destination=root
    )
    assert list(cache.iterdir()) == []  # no log of the refused build either


def test_a_full_disk_met_outside_the_atomic_writers_is_still_one_line(tmp_path, capsys):
    from kinfolk.commands import run

    target = tmp_path / "data.arrow"

    def writes_directly():
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    assert run("kinfolk score", writes_directly) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"kinfolk score: error: no space left on device while writing {target} ")
    with pytest.raises(RuntimeError):  # any other failure keeps its traceback
        run("kinfolk score", lambda: (_ for _ in ()).throw(RuntimeError("a bug")))
