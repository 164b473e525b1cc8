"""ADAPT merges checked against hand-built state dicts and the identities the method rests on."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from adapt_helpers import distilled_copy, init_student
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

from kinfolk.atomic import OutputExistsError
from kinfolk.commands import main
from kinfolk.layout import UnsupportedArchitectureError
from kinfolk.plugins.adapt import (
    DeltaCosineConfig,
    LayerMap,
    LayerMapMismatchError,
    MergeConfigError,
    TensorMismatchError,
    load_config,
    merge,
    write_delta_cosine,
)
from kinfolk.plugins.adapt import execute as execute_module
from kinfolk.tensors import INDEX_FILE, TensorReader
from kinfolk.testing import ARCHITECTURES, build_model, save_model


def tensors(directory):
    return dict(TensorReader(directory))


def assert_same_tensors(left, right):
    assert sorted(left) == sorted(right)
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        assert torch.equal(left[name], right[name]), name


@pytest.fixture(scope="module")
def tied_teachers(tiny_kit, tmp_path_factory):
    """Qwen2 and Llama teachers with tied embeddings (small Qwen/Llama releases tie them)."""
    root = tmp_path_factory.mktemp("tied")
    tokenizer = tiny_kit.tokenizer()
    paths = {}
    for architecture in ("qwen2", "llama"):
        model = build_model(architecture, "large", tokenizer=tokenizer, tie_word_embeddings=True)
        paths[architecture] = save_model(model, tokenizer, root / architecture)
    return paths


def teacher_dir(tiny_kit, tied_teachers, name):
    return tied_teachers[name.split("-")[0]] if name.endswith("-tied") else tiny_kit.model_dir(name, "large")


ALL_TEACHERS = [*ARCHITECTURES, "qwen2-tied", "llama-tied"]


@pytest.mark.parametrize("name", ALL_TEACHERS)
def test_init_student_copies_first_layer_of_each_block(tiny_kit, tied_teachers, tmp_path, name):
    teacher = teacher_dir(tiny_kit, tied_teachers, name)
    student = init_student(teacher, tmp_path / "student", every=2)
    source, result = tensors(teacher), tensors(student)
    expected = {}
    for key, value in source.items():
        if ".layers." not in key:
            expected[key] = value
        elif key.startswith("model.layers.0.") or key.startswith("model.layers.2."):
            layer = int(key.split(".")[2])
            expected[key.replace(f"layers.{layer}.", f"layers.{layer // 2}.")] = value
    assert_same_tensors(result, expected)
    teacher_config, config = AutoConfig.from_pretrained(teacher), AutoConfig.from_pretrained(student)
    assert config.num_hidden_layers == 2
    assert config.tie_word_embeddings == teacher_config.tie_word_embeddings
    if getattr(teacher_config, "layer_types", None):
        assert config.layer_types == [teacher_config.layer_types[0], teacher_config.layer_types[2]]
    assert LayerMap.load(student).blocks == ((0, 2), (2, 4))
    model = AutoModelForCausalLM.from_pretrained(student)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == teacher_config.tie_word_embeddings
    assert (student / "tokenizer.json").exists() and (student / "kinfolk_merge.json").exists()


@pytest.mark.parametrize("name", ALL_TEACHERS)
def test_patching_every_block_of_an_init_student_gives_the_teacher(tiny_kit, tied_teachers, tmp_path, name):
    teacher = teacher_dir(tiny_kit, tied_teachers, name)
    student = init_student(teacher, tmp_path / "student", every=2)
    config = {"op": "patch", "teacher": str(teacher), "student": str(student)}
    family = merge(config, tmp_path / "family", all_sizes=True, progress=False)
    assert_same_tensors(tensors(family / "k2"), tensors(teacher))
    assert_same_tensors(tensors(family / "k0"), tensors(student))
    teacher_config, patched = AutoConfig.from_pretrained(teacher), AutoConfig.from_pretrained(family / "k2")
    assert patched.num_hidden_layers == teacher_config.num_hidden_layers
    assert getattr(patched, "layer_types", None) == getattr(teacher_config, "layer_types", None)
    assert patched.tie_word_embeddings == teacher_config.tie_word_embeddings
    # k1 takes its embeddings from the teacher and its head from the student, which kept the teacher's: still tied
    middle = AutoModelForCausalLM.from_pretrained(family / "k1")
    tied = middle.get_output_embeddings().weight is middle.get_input_embeddings().weight
    assert tied == teacher_config.tie_word_embeddings
    assert ("lm_head.weight" in tensors(family / "k1")) == (not teacher_config.tie_word_embeddings)


def test_patch_says_once_why_it_unties_the_head(tiny_kit, tied_teachers, tmp_path, caplog):
    import logging

    teacher = tied_teachers["llama"]
    student = distilled_copy(
        init_student(teacher, tmp_path / "init", every=2), tmp_path / "student", tiny_kit.tokenizer()
    )
    config = {"op": "patch", "teacher": str(teacher), "student": str(student)}
    with caplog.at_level(logging.WARNING, logger="kinfolk.plugins.adapt.plan"):
        family = merge(config, tmp_path / "family", all_sizes=True, progress=False)
    (said,) = [record.getMessage() for record in caplog.records]
    assert said.startswith("patch: 1 of 3 output models get their own LM head (")
    assert said.endswith("embeddings come from the teacher and their head from the student, whose tied embedding "
                         "matrices differ")  # fmt: skip
    assert "lm_head.weight" in tensors(family / "k1") and "lm_head.weight" not in tensors(family / "k2")


def expected_patch(teacher, student, blocks, patched, tied):
    """The patched state dict assembled by hand from the two state dicts."""
    out, layer = {}, 0
    for index, (start, end) in enumerate(blocks):
        pieces = [(teacher, t) for t in range(start, end)] if index in patched else [(student, index)]
        for source, source_layer in pieces:
            for key, value in source.items():
                if key.startswith(f"model.layers.{source_layer}."):
                    out[key.replace(f"model.layers.{source_layer}.", f"model.layers.{layer}.")] = value
            layer += 1
    front = teacher if 0 in patched else student
    back = teacher if len(blocks) - 1 in patched else student
    out["model.embed_tokens.weight"] = front["model.embed_tokens.weight"]
    out["model.norm.weight"] = back["model.norm.weight"]
    if not tied:
        out["lm_head.weight"] = back["lm_head.weight"]
    elif front is not back:
        out["lm_head.weight"] = back["model.embed_tokens.weight"]
    return out


@pytest.mark.parametrize(
    ("name", "order"),
    [
        ("gemma2", "front-to-back"),
        ("llama-tied", "back-to-front"),
        ("qwen3", "back-to-front"),
        ("olmo2", "front-to-back"),
    ],
)
def test_patch_all_sizes_match_hand_built_models_and_generate(tiny_kit, tied_teachers, tmp_path, name, order):
    teacher = teacher_dir(tiny_kit, tied_teachers, name)
    init = init_student(teacher, tmp_path / "init", layers=[0, 1, 3])  # blocks [0,1) [1,3) [3,4)
    student = distilled_copy(init, tmp_path / "student", tiny_kit.tokenizer())
    config = {"op": "patch", "teacher": str(teacher), "student": str(student), "order": order}
    family = merge(config, tmp_path / "family", all_sizes=True, progress=False)
    listing = json.loads((family / "family.json").read_text())["models"]
    assert [row["num_layers"] for row in listing] == [3, 3, 4, 4]  # the middle block has two layers
    tied = AutoConfig.from_pretrained(teacher).tie_word_embeddings
    source_teacher, source_student = tensors(teacher), tensors(student)
    tokenizer = tiny_kit.tokenizer()
    for k, row in enumerate(listing):
        patched = set(range(k)) if order == "front-to-back" else set(range(3 - k, 3))
        assert row["patched_student_layers"] == sorted(patched)
        expected = expected_patch(source_teacher, source_student, [(0, 1), (1, 3), (3, 4)], patched, tied)
        assert_same_tensors(tensors(family / row["dir"]), expected)
        model = AutoModelForCausalLM.from_pretrained(family / row["dir"])
        assert model.config.num_hidden_layers == row["num_layers"]
        head_is_embedding = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        assert head_is_embedding == (tied and row["embeddings_from"] == row["head_from"])
        prompt = tokenizer("What is 2 + 2?", return_tensors="pt")
        generated = model.generate(**prompt, max_new_tokens=4, do_sample=False)
        assert generated.shape[1] == prompt["input_ids"].shape[1] + 4
        # the patched model is itself a student of the teacher: patching all of it gives the teacher back
        assert LayerMap.load(family / row["dir"]).num_student_layers == row["num_layers"]


def test_patch_explicit_layers_and_sharded_inputs(tiny_kit, tmp_path):
    teacher = tiny_kit.model_dir("llama", "large", sharded=True)
    init = init_student(teacher, tmp_path / "init", every=2)
    student = distilled_copy(init, tmp_path / "student", tiny_kit.tokenizer())
    config = {
        "op": "patch",
        "teacher": str(teacher),
        "student": str(student),
        "patched_layers": [1],
        "max_shard_size": "40KB",
    }
    out = merge(config, tmp_path / "patched", progress=False)
    assert (out / INDEX_FILE).exists()
    expected = expected_patch(tensors(teacher), tensors(student), [(0, 2), (2, 4)], {1}, tied=False)
    assert_same_tensors(tensors(out), expected)
    AutoModelForCausalLM.from_pretrained(out)


@pytest.mark.parametrize(("dtype", "delta_dtype"), [(torch.float32, "float64"), (torch.bfloat16, "float32")])
def test_apply_delta_of_distilled_minus_init_gives_distilled(tiny_kit, tmp_path, dtype, delta_dtype):
    tokenizer = tiny_kit.tokenizer()
    teacher = save_model(build_model("qwen3", "large", tokenizer=tokenizer).to(dtype), tokenizer, tmp_path / "t")
    init = init_student(teacher, tmp_path / "init", every=2)
    distilled = distilled_copy(init, tmp_path / "distilled", tokenizer, dtype=dtype)
    delta = merge(
        {"op": "delta", "init": str(init), "distilled": str(distilled), "dtype": delta_dtype},
        tmp_path / "delta",
        progress=False,
    )
    assert json.loads(TensorReader(delta).metadata()["adapt_layer_map"])["blocks"] == [[0, 2], [2, 4]]
    applied = merge(
        {"op": "apply-delta", "init": str(init), "delta": str(delta)}, tmp_path / "applied", progress=False
    )
    assert_same_tensors(tensors(applied), tensors(distilled))
    assert AutoConfig.from_pretrained(applied).num_hidden_layers == 2
    assert LayerMap.load(applied) == LayerMap.load(init)
    # alpha scales the delta: init + 0.5 (distilled - init)
    half = merge(
        {"op": "apply-delta", "init": str(init), "delta": str(delta), "alpha": 0.5, "dtype": "float32"},
        tmp_path / "half",
        progress=False,
    )
    source_init, source_distilled = tensors(init), tensors(distilled)
    for name, value in tensors(half).items():
        reference = source_init[name].double() + 0.5 * (source_distilled[name].double() - source_init[name].double())
        torch.testing.assert_close(value.double(), reference, rtol=0, atol=1e-6)


def test_weight_delta_transfers_to_a_variant(tiny_kit, tmp_path):
    """θ_init(variant) + (θ_distill(base) − θ_init(base)), tensor by tensor."""
    family = tiny_kit.family("qwen2")
    base_init = init_student(family["small_base"], tmp_path / "base-init", layers=[0])
    variant_init = init_student(family["small_instruct"], tmp_path / "variant-init", layers=[0])
    base_distilled = distilled_copy(base_init, tmp_path / "base-distilled", tiny_kit.tokenizer())
    delta = merge(
        {"op": "delta", "init": str(base_init), "distilled": str(base_distilled), "dtype": "float64"},
        tmp_path / "delta",
        progress=False,
    )
    out = merge(
        {"op": "apply-delta", "init": str(variant_init), "delta": str(delta)}, tmp_path / "out", progress=False
    )
    variant, distilled, base = tensors(variant_init), tensors(base_distilled), tensors(base_init)
    for name, value in tensors(out).items():
        reference = (variant[name].double() + distilled[name].double() - base[name].double()).float()
        assert torch.equal(value, reference), name


def test_interpolate_endpoints_and_midpoint(tiny_kit, tmp_path):
    family = tiny_kit.family("gemma2")
    a, b = tensors(family["small_base"]), tensors(family["small_instruct"])
    for alpha, check in ((0.0, "a"), (1.0, "b"), (0.25, None)):
        config = {
            "op": "interpolate",
            "a": str(family["small_base"]),
            "b": str(family["small_instruct"]),
            "alpha": alpha,
        }
        out = tensors(merge(config, tmp_path / f"alpha-{alpha}", progress=False))
        if check:
            assert_same_tensors(out, a if check == "a" else b)
        else:
            for name, value in out.items():
                torch.testing.assert_close(value, 0.75 * a[name] + 0.25 * b[name])


def test_delta_cosine_against_direct_computation(tiny_kit, tmp_path):
    tokenizer = tiny_kit.tokenizer()
    init = init_student(tiny_kit.model_dir("llama", "large"), tmp_path / "init", every=2)
    deltas = []
    for seed in (1, 2):
        distilled = distilled_copy(init, tmp_path / f"distilled-{seed}", tokenizer, seed=seed)
        deltas.append(
            merge(
                {"op": "delta", "init": str(init), "distilled": str(distilled)},
                tmp_path / f"delta-{seed}",
                progress=False,
            )
        )
    result = write_delta_cosine(
        DeltaCosineConfig(a=str(deltas[0]), b=str(deltas[1])), tmp_path / "cos.json", progress=False
    )
    first, second = tensors(deltas[0]), tensors(deltas[1])
    flat = [torch.cat([d[name].double().flatten() for name in sorted(d)]) for d in (first, second)]
    assert result["cosine"] == pytest.approx(float(torch.nn.functional.cosine_similarity(*flat, dim=0)), abs=1e-9)
    layer1 = [
        torch.cat([d[n].double().flatten() for n in sorted(d) if n.startswith("model.layers.1.")])
        for d in (first, second)
    ]
    assert result["per_layer"][1]["cosine"] == pytest.approx(
        float(torch.nn.functional.cosine_similarity(*layer1, dim=0)), abs=1e-9
    )
    same = write_delta_cosine(
        DeltaCosineConfig(a=str(deltas[0]), b=str(deltas[0])), tmp_path / "same.json", progress=False
    )
    assert same["cosine"] == pytest.approx(1.0)
    assert json.loads((tmp_path / "cos.json").read_text())["cosine"] == result["cosine"]


# ---------------------------------------------------------------------------------------------------------------
# Refusals: every bad input is named before anything is written.


@pytest.fixture(scope="module")
def qwen_students(tiny_kit, tmp_path_factory):
    root = tmp_path_factory.mktemp("students")
    teacher = tiny_kit.model_dir("qwen3", "large")
    init = init_student(teacher, root / "init", every=2)
    distilled = distilled_copy(init, root / "distilled", tiny_kit.tokenizer())
    delta = merge({"op": "delta", "init": str(init), "distilled": str(distilled)}, root / "delta", progress=False)
    return {"teacher": teacher, "init": init, "distilled": distilled, "delta": delta, "root": root}


def edited_copy(source, out, edit):
    """Save a copy of the model at `source` after `edit(state_dict)`; keeps the layer map."""
    state = tensors(source)
    edit(state)
    out.mkdir()
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    for name in ("config.json", "adapt_layer_map.json"):
        if (source / name).exists():
            (out / name).write_bytes((source / name).read_bytes())
    return out


@pytest.mark.parametrize(
    ("kind", "edit"),
    [
        ("missing", lambda s: s.pop("model.layers.1.mlp.up_proj.weight")),
        ("extra", lambda s: s.__setitem__("model.layers.1.mlp.extra.weight", torch.zeros(2))),
        ("shape", lambda s: s.__setitem__("model.norm.weight", torch.zeros(7))),
        ("dtype", lambda s: s.__setitem__("model.norm.weight", s["model.norm.weight"].half())),
    ],
)
def test_apply_delta_names_first_mismatching_tensor(qwen_students, tmp_path, kind, edit):
    bad_init = edited_copy(qwen_students["init"], tmp_path / "bad", edit)
    config = {"op": "apply-delta", "init": str(bad_init), "delta": str(qwen_students["delta"])}
    with pytest.raises(TensorMismatchError) as caught:
        merge(config, tmp_path / "out", progress=False)
    assert caught.value.kind == kind
    assert caught.value.tensor in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_delta_built_on_another_layer_map_is_refused(qwen_students, tmp_path):
    other_init = init_student(qwen_students["teacher"], tmp_path / "other", layers=[0, 1])
    config = {"op": "apply-delta", "init": str(other_init), "delta": str(qwen_students["delta"])}
    with pytest.raises(LayerMapMismatchError, match=r"different layer maps.*\(0, 2\), \(2, 4\)"):
        merge(config, tmp_path / "out", progress=False)
    without_map = tmp_path / "without-map"
    without_map.mkdir()
    for path in qwen_students["init"].iterdir():
        if path.name != "adapt_layer_map.json":
            (without_map / path.name).write_bytes(path.read_bytes())
    config["init"] = str(without_map)
    with pytest.raises(LayerMapMismatchError, match="has none"):
        merge(config, tmp_path / "out", progress=False)


def test_unsupported_architecture_is_named(tmp_path):
    config = AutoConfig.for_model("gpt2", n_layer=2, n_embd=32, n_head=2, vocab_size=64)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(UnsupportedArchitectureError, match="'gpt2'"):
        merge({"op": "init-student", "teacher": str(tmp_path / "gpt2"), "layers": {"every": 2}}, tmp_path / "out")


def test_config_errors_name_the_field(qwen_students, tmp_path):
    with pytest.raises(MergeConfigError, match=r"unknown field.*'alpah'"):
        load_config("apply-delta", {"init": "a", "delta": "b", "alpah": 1})
    with pytest.raises(MergeConfigError, match="'delta' is required"):
        load_config("apply-delta", {"init": "a"})
    with pytest.raises(MergeConfigError, match="layer 0"):
        merge({"op": "init-student", "teacher": str(qwen_students["teacher"]), "layers": {"last": 2}}, tmp_path / "o")
    with pytest.raises(MergeConfigError, match="outside"):
        merge(
            {"op": "init-student", "teacher": str(qwen_students["teacher"]), "layers": {"layers": [0, 9]}},
            tmp_path / "o",
        )
    patch = {"op": "patch", "teacher": str(qwen_students["teacher"]), "student": str(qwen_students["init"])}
    with pytest.raises(MergeConfigError, match="'num_patched' is 3 but the student has only 2"):
        merge({**patch, "num_patched": 3}, tmp_path / "o")
    with pytest.raises(MergeConfigError, match="--all"):
        merge(patch, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_patch_refuses_a_student_of_another_teacher(qwen_students, tiny_kit, tmp_path):
    config = {
        "op": "patch",
        "teacher": str(tiny_kit.model_dir("qwen3", "small")),
        "student": str(qwen_students["init"]),
        "num_patched": 1,
    }
    with pytest.raises(ValueError, match="partitions 4 teacher layers but the teacher"):
        merge(config, tmp_path / "o")


# ---------------------------------------------------------------------------------------------------------------
# Output handling: atomic, refusing to overwrite, deterministic.


def test_interrupted_merge_leaves_no_destination(qwen_students, tmp_path, monkeypatch):
    real, calls = execute_module.materialise, []

    def failing(tensor, inputs):
        calls.append(tensor.name)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(tensor, inputs)

    monkeypatch.setattr(execute_module, "materialise", failing)
    config = {
        "op": "apply-delta",
        "init": str(qwen_students["init"]),
        "delta": str(qwen_students["delta"]),
        "max_shard_size": "20KB",
    }
    with pytest.raises(KeyboardInterrupt):
        merge(config, tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_output_is_deterministic_and_not_overwritten_by_default(qwen_students, tmp_path):
    config = {"op": "patch", "teacher": str(qwen_students["teacher"]), "student": str(qwen_students["distilled"])}
    first = merge(config, tmp_path / "first", all_sizes=True, progress=False)
    second = merge(config, tmp_path / "second", all_sizes=True, progress=False)
    files = sorted(path.relative_to(first) for path in first.rglob("*") if path.is_file())
    assert files == sorted(path.relative_to(second) for path in second.rglob("*") if path.is_file())
    for name in files:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    with pytest.raises(OutputExistsError):
        merge(config, first, all_sizes=True, progress=False)
    merge({**config, "num_patched": 1}, first, overwrite=True, progress=False)
    assert not (first / "family.json").exists()
    provenance = json.loads((first / "kinfolk_merge.json").read_text())
    assert provenance["op"] == "patch" and set(provenance["inputs"]) == {"teacher", "student"}
    assert provenance["output"]["k"] == 1


def safetensors_names(directory) -> list[str]:
    from safetensors import safe_open

    names = []
    for path in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            names += list(handle.keys())
    return names


def test_cli_writes_refuses_and_dry_runs(qwen_students, tmp_path, capsys):
    """One run as a process of its own (the command line as installed); the refusal and the dry runs in this process
    (tests/test_bad_inputs_commands.py shows a refusal's exit code and line from a real process)."""
    config = tmp_path / "init.yaml"
    config.write_text(f"teacher: {qwen_students['teacher']}\nlayers:\n  every: 2\n  last: 1\n")
    argv = ["merge", "init-student", str(config), "--no-progress"]
    command = [sys.executable, "-m", "kinfolk", *argv]
    done = subprocess.run([*command, "--out", str(tmp_path / "s")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert LayerMap.load(tmp_path / "s").blocks == ((0, 2), (2, 3), (3, 4))
    assert main([*argv, "--out", str(tmp_path / "s")]) == 2
    assert "already exists" in capsys.readouterr().err
    planned = tmp_path / "planned"
    assert main([*argv, "--dry-run", "--out", str(planned)]) == 0 and not planned.exists()
    lines = capsys.readouterr().out.splitlines()  # a summary: the inputs, the output at --out, its tensors by input
    assert lines[:2] == ["kinfolk merge init-student", f"  input teacher: {qwen_students['teacher']}"]
    count = len(safetensors_names(tmp_path / "s"))  # every tensor of init-student comes from the teacher
    assert lines[2].startswith(f"  output {planned}: {count} tensors, ") and lines[3:] == [
        "    num_layers 3; blocks [[0, 2], [2, 3], [3, 4]]",
        f"    {count} tensors from teacher",
    ]
    assert max(map(len, lines[3:])) <= 100
    assert main([*argv, "--dry-run", "--verbose"]) == 0
    assert "model.layers.2.mlp.up_proj.weight = teacher[model.layers.3" in capsys.readouterr().out
