"""The bad-input matrix of the command line: each case runs `kinfolk <verb> ...` (in this process, as
`kinfolk.commands.main`; a few as real subprocesses at the end) and asserts exit 2, one line on stderr naming the
offending file, field, row or tensor, no traceback, nothing at the destination and the inputs untouched
(`refusal_helpers.assert_command_refused`). `kinfolk sft`'s cases are in `test_bad_inputs_sft.py`, `kinfolk eval`'s and
`kinfolk churn`'s in `test_bad_inputs_lm_eval.py`.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from adapt_helpers import init_student
from datasets import Dataset, DatasetDict
from refusal_helpers import assert_command_refused, write_lines

from kinfolk.plugins.adapt import LAYER_MAP_FILE
from kinfolk.plugins.atlantis import scoring as scoring_module
from kinfolk.testing import prompt_completion_dataset


@pytest.fixture(scope="module")
def family(tiny_kit):
    return tiny_kit.family("llama")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Data files, good and bad, shared by the cases (which must leave them untouched)."""
    root = tmp_path_factory.mktemp("bad-inputs")
    prompt_completion_dataset(6).to_json(str(root / "train.jsonl"))
    (root / "empty.jsonl").write_text("")
    (root / "blank.jsonl").write_text("\n\n  \n")
    write_lines(root / "broken.jsonl", ['{"prompt": "a", "completion": "b"}\n', '{"prompt": \n'])
    write_lines(root / "no-sft-columns.jsonl", [{"question": "q", "answer": "a"}, "\n"])
    write_lines(root / "empty-response.jsonl", [{"prompt": "2+2=", "completion": ""}, "\n"])
    Dataset.from_dict({"prompt": [], "completion": []}).save_to_disk(str(root / "empty-saved"))
    DatasetDict({"validation": prompt_completion_dataset(4)}).save_to_disk(str(root / "validation-only"))
    (root / "damaged-saved").mkdir()
    (root / "damaged-saved" / "state.json").write_text("{}")
    (root / "a-file").write_text("not a directory")
    return root


# --- score ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def no_forward_pass(monkeypatch):
    """Fails the test if a model is loaded for scoring: refusals must come before the expensive part."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded for a forward pass before the bad input was found")

    monkeypatch.setattr(scoring_module, "load_model", refuse)


def models_of(family, *roles):
    roles = roles or ("large_base", "small_base", "reference")
    paths = {
        "large_base": family["large_base"],
        "small_base": family["small_base"],
        "reference": family["small_instruct"],
    }
    return [item for role in roles for item in (f"--{role}", paths[role])]


SCORE_DATA_CASES = {
    "empty file": ("empty.jsonl", [], ["empty.jsonl", "is empty"]),
    "blank lines only": ("blank.jsonl", [], ["blank.jsonl", "is empty"]),
    "broken JSON line": ("broken.jsonl", [], ["broken.jsonl", "cannot be read as json", "row 1"]),
    "missing file": ("missing.jsonl", [], ["missing.jsonl", "no such data file"]),
    "no SFT columns": (
        "no-sft-columns.jsonl",
        [],
        ["no-sft-columns.jsonl", "columns present: ['answer', 'question']"],
    ),
    "empty saved dataset": ("empty-saved", [], ["empty-saved", "holds no rows"]),
    "split not in the saved dataset": ("validation-only", [], ["validation-only", "not 'train'", "'validation'"]),
    "damaged saved dataset": ("damaged-saved", [], ["damaged-saved", "cannot be read as a saved dataset"]),
    "a row with an empty response": (
        "empty-response.jsonl",
        [],
        ["empty-response.jsonl", "rows [0]", "empty response"],
    ),
    "rows longer than the model": (
        "train.jsonl",
        ["--max_length", "2"],
        [
            "train.jsonl",
            "rows [0, 1",
            "context of 2",
            "pass --overlong skip to leave them unscored, or a larger --max_",
        ],
    ),
}


@pytest.mark.parametrize("case", list(SCORE_DATA_CASES))
def test_score_refuses_bad_data_naming_the_file(family, files, tmp_path, no_forward_pass, case):
    data, options, named = SCORE_DATA_CASES[case]
    out = tmp_path / "scored.jsonl"
    assert_command_refused(
        ["score", "--data", files / data, "--out", out, "--use_cache", "false", *models_of(family), *options],
        *named,
        destination=out,
        inputs=[files],
    )


def test_score_refuses_a_data_file_without_scores_when_no_model_is_given(files, tmp_path):
    out = tmp_path / "reweighted.jsonl"
    assert_command_refused(
        ["score", "--data", files / "train.jsonl", "--out", out],
        files / "train.jsonl",
        "holds no scores",
        destination=out,
        inputs=[files],
    )


@pytest.fixture
def data_never_read(monkeypatch):
    """Fails the test if `kinfolk score` reads its data: model and output checks come before (a Hub dataset or a
    large file takes minutes to load)."""
    import kinfolk.data

    def refuse(*args, **kwargs):
        raise AssertionError("the data was read before the models and --out were checked")

    monkeypatch.setattr(kinfolk.data, "load_data", refuse)  # `kinfolk score` imports it when it runs


def test_score_checks_models_before_reading_the_data(family, files, tmp_path, data_never_read):
    out = tmp_path / "scored.jsonl"
    missing = tmp_path / "no-such-model"
    common = ["score", "--data", files / "train.jsonl", "--out", out, "--use_cache", "false"]
    assert_command_refused(
        [*common, "--large_base", missing, *models_of(family, "small_base", "reference")],
        "large_base model",
        missing,
        "no such directory",
        destination=out,
    )
    assert_command_refused(
        [*common, *models_of(family, "large_base", "reference")],
        "formula 'ratio' needs the small_base model; given: large_base, reference",
        destination=out,
    )
    broken = tmp_path / "broken-tokenizer"
    shutil.copytree(family["small_base"], broken)
    (broken / "tokenizer.json").write_text("{")
    assert_command_refused(
        [*common, *models_of(family, "large_base", "reference"), "--small_base", broken],
        broken / "tokenizer.json",
        "not valid JSON",
        destination=out,
        inputs=[broken],
    )


def test_score_checks_the_cache_and_out_before_reading_the_data(family, files, tmp_path, data_never_read):
    out = tmp_path / "scored.jsonl"
    common = ["score", "--data", files / "train.jsonl", *models_of(family)]
    assert_command_refused(
        [*common, "--out", out, "--cache_dir", files / "a-file" / "scores"],
        files / "a-file",
        "is a file, not a directory",
        destination=out,
        inputs=[files],
    )
    assert_command_refused(
        [*common, "--out", files / "a-file" / "scored.jsonl", "--use_cache", "false"],
        files / "a-file",
        "is a file",
        inputs=[files],
    )
    existing = files / "train.jsonl"
    assert_command_refused([*common, "--out", existing], existing, "already exists", "--overwrite", inputs=[files])
    assert_command_refused(
        [*common, "--out", tmp_path / "scored.csv"], "scored.csv", "not .csv", destination=tmp_path / "scored.csv"
    )


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--chunk_rows", "0"], "chunk_rows must be a positive integer, got 0"),
        (["--max_length", "0"], "max_length must be a positive integer, got 0"),
        (["--formula", "odds"], "argument --formula: invalid choice: 'odds'"),
        (["--temperature", "0"], "temperature must be positive"),
        (["--clip_quantiles", "0.9", "0.1"], "clip_quantiles must satisfy 0 <= low < high <= 1"),
        (["--no_such_option", "1"], "--no_such_option: unknown option"),
    ],
)
def test_score_refuses_bad_options_as_usage_errors(files, tmp_path, options, named):
    out = tmp_path / "scored.jsonl"
    assert_command_refused(
        ["score", "--data", files / "train.jsonl", "--out", out, *options], named, destination=out, inputs=[files]
    )


# --- merge ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def merge_inputs(tiny_kit, tmp_path_factory):
    """A 4-layer teacher, two students of it on different maps, an unrelated teacher of the same shape, and a copy
    of the teacher with truncated weights."""
    root = tmp_path_factory.mktemp("merge-cli")
    teacher = tiny_kit.model_dir("qwen3", "large")
    truncated = root / "truncated-teacher"
    shutil.copytree(teacher, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return {
        "teacher": teacher,
        "student": init_student(teacher, root / "student", every=2),
        "other-student": init_student(teacher, root / "other-student", layers=[0, 1]),
        "stranger": tiny_kit.model_dir("qwen3", "large", seed=1),
        "truncated": truncated,
        "root": root,
    }


def merge_config(tmp_path, text_or_fields):
    path = tmp_path / "merge.yaml"
    path.write_text(text_or_fields if isinstance(text_or_fields, str) else json.dumps(text_or_fields))
    return path


def patch_fields(inputs, **fields):
    return {"teacher": str(inputs["teacher"]), "student": str(inputs["student"]), **fields}


MERGE_CASES = {
    # config files
    "no config file": ("patch", None, [], ["config file", "not found"]),
    "config not YAML": ("patch", "teacher: [a, b\nstudent: x\n", [], ["merge.yaml", "is not valid YAML"]),
    "config not a mapping": ("patch", "- a\n- b\n", [], ["merge.yaml", "must hold a YAML mapping", "got list"]),
    "unknown field": ("patch", {"teachr": "x"}, [], ["merge.yaml", "unknown field(s) ['teachr']"]),
    "required field missing": ("delta", {"init": "x"}, [], ["merge.yaml", "field 'distilled' is required"]),
    "config of another operation": ("patch", {"op": "delta"}, [], ["the config is for another operation"]),
    "mistyped field": ("interpolate", {"a": "x", "b": "y", "alpha": "half"}, [], ["merge.yaml", "field 'alpha'"]),
    "unknown dtype": ("patch", "DTYPE", [], ["merge.yaml", "field 'dtype'", "'fp8'"]),
    "unknown operation": ("graft", {}, [], ["argument op: invalid choice: 'graft'"]),
    # inputs that do not belong together
    "another teacher": (
        "patch",
        "STRANGER",
        [],
        ["qwen3-large-s1", "is not the teacher the student", "allow_other_teacher"],
    ),
    "another student's layer map": ("patch", "OTHER-MAP", [], [LAYER_MAP_FILE, "(0, 1), (1, 4)", "(0, 2), (2, 4)"]),
    "selection past the teacher": ("init-student", "FIRST-9", [], ["field 'layers'", "first: 9 is more than"]),
    "patched layers past the student": ("patch", "NUM-PATCHED-3", [], ["'num_patched' is 3", "only 2"]),
    # broken inputs
    "truncated teacher weights": ("patch", "TRUNCATED", [], ["truncated-teacher", "model.safetensors"]),
    "student missing": ("patch", "NO-STUDENT", [], ["student", "no-such-student"]),
    "dry run of a bad selection": ("init-student", "FIRST-9", ["--dry-run"], ["field 'layers'", "first: 9"]),
    "dry run of delta-cosine": ("delta-cosine", {"a": "x", "b": "y"}, ["--dry-run"], ["--dry-run does not apply"]),
}


def merge_case_config(inputs, tmp_path, config):
    """The YAML text or fields a case names (placeholders stand for configs that need the inputs' paths)."""
    placeholders = {
        "DTYPE": patch_fields(inputs, dtype="fp8"),
        "STRANGER": patch_fields(inputs, teacher=str(inputs["stranger"]), num_patched=1),
        "OTHER-MAP": patch_fields(inputs, layer_map=str(inputs["other-student"] / LAYER_MAP_FILE), num_patched=1),
        "FIRST-9": {"teacher": str(inputs["teacher"]), "layers": {"first": 9}},
        "NUM-PATCHED-3": patch_fields(inputs, num_patched=3),
        "TRUNCATED": patch_fields(inputs, teacher=str(inputs["truncated"]), num_patched=1),
        "NO-STUDENT": patch_fields(inputs, student=str(tmp_path / "no-such-student"), num_patched=1),
    }
    if config is None:
        return tmp_path / "missing.yaml"
    return merge_config(tmp_path, placeholders.get(config, config) if isinstance(config, str) else config)


@pytest.mark.parametrize("case", list(MERGE_CASES))
def test_merge_refuses_bad_configs_and_inputs(merge_inputs, tmp_path, case):
    op, config, options, named = MERGE_CASES[case]
    out = tmp_path / "out"
    config_file = merge_case_config(merge_inputs, tmp_path, config)
    assert_command_refused(
        ["merge", op, config_file, "--out", out, "--no-progress", *options],
        *named,
        destination=out,
        inputs=[merge_inputs["root"], merge_inputs["teacher"], merge_inputs["stranger"]],
    )


def test_merge_refuses_a_missing_or_existing_out(merge_inputs, tmp_path):
    config = merge_config(tmp_path, patch_fields(merge_inputs, num_patched=1))
    assert_command_refused(["merge", "patch", config], "--out is required")
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    assert_command_refused(
        ["merge", "patch", config, "--out", existing], existing, "already exists", "--overwrite", inputs=[existing]
    )


# --- drift ---------------------------------------------------------------------------------------------------------

TARGET = "lm_eval/kinfolk_mbpp_plus_sample/pass_at_1_count"


@pytest.fixture(scope="module")
def drift_runs(tmp_path_factory):
    """Two methods' runs (drift.jsonl as the callbacks write them) and broken variants."""
    from kinfolk.drift.log import append_row

    root = tmp_path_factory.mktemp("drift-cli")
    for method, kls in {"atlas": [0.002, 0.003], "lora": [0.004, 0.006]}.items():
        for step, (target, kl) in enumerate(zip([10, 12], kls), start=1):
            append_row(root / method, {"step": step, "retained_kl": kl, TARGET: float(target)})
    shutil.copytree(root / "lora", root / "broken")
    with open(root / "broken" / "drift.jsonl", "a") as handle:
        handle.write('{"step": 3, "retained_kl": \n')
    append_row(root / "no-step", {"retained_kl": 0.1, TARGET: 10.0})
    append_row(root / "text-score", {"step": 1, "retained_kl": 0.1, TARGET: "ten"})
    append_row(root / "no-target", {"step": 1, "retained_kl": 0.1})
    append_row(root / "far", {"step": 1, "retained_kl": 0.1, TARGET: 50.0})
    (root / "a-file").write_text("")
    return root


DRIFT_CASES = {
    "no runs": ([], [], ["no --run METHOD SEED PATH given"]),
    "run directory missing": ([("lora", "1", "missing")], [], ["missing/drift.jsonl: no such drift log"]),
    "broken line": ([("lora", "1", "broken")], [], ["broken/drift.jsonl:3 is not JSON"]),
    "row without a step": ([("lora", "1", "no-step")], [], ["no-step/drift.jsonl:1 is not a drift row"]),
    "score not a number": ([("lora", "1", "text-score")], [], ["text-score", "step 1", "'ten', not a finite number"]),
    "target never logged": (
        [("lora", "1", "no-target")],
        [],
        ["no-target", f"has no --target key {TARGET!r} in any row (its rows carry ['retained_kl'])"],
    ),
    "target misspelled": (
        [],
        ["--target", TARGET.replace("pass", "pas")],
        [f"no --target key {TARGET.replace('pass', 'pas')!r} in any row", f"did you mean {TARGET!r}?"],
    ),
    "method without runs": ([("lora", "1", "lora")], ["--method", "dora"], ["method 'dora' has no runs"]),
    "one method and seed twice": ([("lora", "1", "lora"), ("lora", "1", "atlas")], [], ["'lora' and seed '1'"]),
    "no shared target range": ([("lora", "1", "far")], [], ["share no range", "pass --requirements"]),
    "requirements not numbers": ([], ["--requirements", "a:b"], ["--requirements takes low:high", "'a:b'"]),
    "requirements not integers": ([], ["--requirements", "1.5:3"], ["a range needs integers"]),
    "no resamples": ([], ["--bootstrap", "0"], ["--bootstrap must be at least 1"]),
    "out exists": ([], ["--out", "{root}/atlas"], ["atlas already exists"]),
    "out under a file": ([], ["--out", "{root}/a-file/report"], ["a-file is a file"]),
}


@pytest.mark.parametrize("case", list(DRIFT_CASES))
def test_drift_refuses_bad_runs_and_options_in_one_line(drift_runs, tmp_path, case):
    runs, options, named = DRIFT_CASES[case]
    if case != "no runs":
        runs = [("atlas", "1", "atlas"), *runs] if runs else [("atlas", "1", "atlas"), ("lora", "1", "lora")]
    out = tmp_path / "report"
    options = [option.format(root=drift_runs) for option in options]
    argv = ["drift", "--target", TARGET, *(["--method", "atlas"] if "--method" not in options else [])]
    argv += [item for method, seed, path in runs for item in ("--run", method, seed, drift_runs / path)]
    argv += [*options, *([] if "--out" in options else ["--out", out])]
    assert_command_refused(argv, *named, destination=out, inputs=[drift_runs])


def test_drift_refuses_a_run_without_its_three_values(drift_runs, tmp_path):
    out = tmp_path / "report"
    argv = ["drift", "--target", TARGET, "--method", "atlas", "--out", out, "--run", "atlas", drift_runs / "atlas"]
    assert_command_refused(argv, "--run takes METHOD SEED PATH", destination=out, inputs=[drift_runs])


# --- lab -----------------------------------------------------------------------------------------------------------


@pytest.fixture
def no_family_build(monkeypatch):
    """Fails the test if the lab starts building a family (minutes) before refusing."""
    import kinfolk.lab.world.family

    def refuse(*args, **kwargs):
        raise AssertionError("a family build started before the bad option was refused")

    monkeypatch.setattr(kinfolk.lab.world.family, "build_family", refuse)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["experiment", "atlantis-controls", "run", "--families", "7"], "family units [7] are not in its plan"),
        (["experiment", "atlas-controls", "run", "--families", "-2"], "family units [-2] are not in its plan"),
        (["experiment", "adapt-controls", "run", "--runs", "5"], "runs [5] are not in its plan"),
        (["experiment", "adapt", "run"], "adapt re-analyses the committed records"),
        (["experiment", "lora"], "choose an experiment"),
    ],
)
def test_lab_refuses_an_experiment_with_nothing_to_run_before_building(
    tmp_path, monkeypatch, no_family_build, argv, named
):
    monkeypatch.chdir(tmp_path)  # where the runs' log and records would go
    assert_command_refused(["lab", *argv], named, destination=tmp_path / "runs")
    assert list(tmp_path.iterdir()) == []


# --- as real processes: exit code 2 and one line on stderr, no traceback -------------------------------------------


def test_real_processes_exit_2_with_one_line_and_no_traceback(family, files, merge_inputs, drift_runs, tmp_path):
    out = tmp_path / "out"
    cases = [
        (["score", "--data", files / "train.jsonl", "--out", out, *models_of(family), "--small_base", tmp_path / "gone"],
         "gone"),
        (["merge", "patch", merge_case_config(merge_inputs, tmp_path, "STRANGER"), "--out", out], "qwen3-large-s1"),
        (["drift", "--target", TARGET, "--method", "atlas", "--out", out, "--run", "lora", "1", drift_runs / "broken"],
         "broken/drift.jsonl:3"),
        (["lab", "experiment", "atlantis-controls", "run", "--families", "9"], "family units [9] are not in its plan"),
    ]  # fmt: skip
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    for argv, named in cases:
        command = [sys.executable, "-m", "kinfolk", *map(str, argv)]
        finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
        assert finished.returncode == 2, finished.stderr[-3000:]
        assert "Traceback" not in finished.stderr, finished.stderr[-3000:]
        lines = finished.stderr.strip().splitlines()
        assert re.match(rf"kinfolk {argv[0]}( [\w-]+)*: error: ", lines[-1]) and named in lines[-1], finished.stderr[
            -3000:
        ]
        assert sum(line.startswith("kinfolk ") for line in lines) == 1
        assert not out.exists()
