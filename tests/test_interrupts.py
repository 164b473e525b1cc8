"""SIGTERM and SIGINT in the long verbs: the process stops, prints one line saying what is kept and the command that
resumes, exits 143 / 130; nothing half-written is left; the printed command, run as given, resumes and says what
it resumed from.

`kinfolk score` and `kinfolk merge patch --all` run as real processes (`kill_jobs.py --signal`: the job sends the
signal to itself once it has done some of the work, so the test does not race the scheduler), and their printed
resume commands run in this process; `kinfolk distil` and `kinfolk sft` (which launch processes of their own) and
their resume commands run as processes; `kinfolk lab experiment` runs in this process with its family runs replaced
by a stub that sends the signal after the first family.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset
from kill_helpers import ENVIRONMENT, JOBS, assert_same_files, staging_left

from kinfolk.atomic import staging_owner

EXIT = {"SIGTERM": 143, "SIGINT": 130}


def signalled_job(tmp_path, job: str, arguments: dict, *signal_point: str) -> subprocess.CompletedProcess:
    spec = tmp_path / f"{job}-{len(list(tmp_path.glob('*.json')))}.json"
    spec.write_text(json.dumps(arguments, default=str))
    command = [sys.executable, str(JOBS), job, str(spec), *signal_point]
    return subprocess.run(command, env=ENVIRONMENT, capture_output=True, text=True, timeout=600, cwd=JOBS.parent)


def stopped_line(done: subprocess.CompletedProcess, verb: str, signal_name: str) -> str:
    """The one line of an interrupted verb (the last on stderr; no traceback), checked for its parts."""
    assert done.returncode == EXIT[signal_name], done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith(f"kinfolk {verb}: stopped by")]
    assert len(lines) == 1 and done.stderr.rstrip().splitlines()[-1] == lines[0], done.stderr[-3000:]
    assert re.fullmatch(rf"kinfolk {verb}: stopped by {signal_name}; kept: .+; resume: kinfolk {verb} .+", lines[0])
    return lines[0]


def last_checkpoint_step(directory: Path) -> int:
    """The step of the last published checkpoint. With `save_total_limit` 1 the Trainer deletes the older one only
    after the newer is saved, so a signal in between leaves two, and the rerun resumes from the last."""
    steps = sorted(int(path.name.split("-")[1]) for path in directory.glob("checkpoint-*"))
    assert 1 <= len(steps) <= 2, steps
    return steps[-1]


def in_process(argv: list[str]) -> tuple[int, str]:
    """`kinfolk ARGV` in this process: its exit code and what it wrote to stderr."""
    from kinfolk.commands import main

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        status = main(argv)
    return status, stderr.getvalue()


def resume_argv(line: str) -> list[str]:
    """The resume command exactly as the line gives it, without its leading `kinfolk`."""
    argv = shlex.split(line.split("; resume: ", 1)[1])
    assert argv[0] == "kinfolk"
    return argv[1:]


def run_resume_command(line: str) -> subprocess.CompletedProcess:
    """The resume command as a process of its own (for verbs that launch their own processes)."""
    command = [sys.executable, "-m", "kinfolk", *resume_argv(line)]
    return subprocess.run(command, env=ENVIRONMENT, capture_output=True, text=True, timeout=600, cwd=JOBS.parent)


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_an_interrupted_score_says_what_it_keeps_and_its_rerun_resumes_from_the_cache(
    score_setup, tmp_path, signal_name
):
    cache, out = tmp_path / "cache", tmp_path / "scored"
    arguments = {**score_setup, "cache_dir": str(cache), "out": str(out), "overwrite": False}
    del arguments["reference"]
    # after 3 chunks of the second model (10 chunks of 4 rows per model)
    point = ["--signal", signal_name, "kinfolk.plugins.atlantis.cache:ScoreCache.write", "after", "13"]
    line = stopped_line(signalled_job(tmp_path, "score", arguments, *point), "score", signal_name)
    assert f"the score cache in {cache}" in line
    assert not out.exists() and staging_left(tmp_path) == []
    cached = {}  # rows per model's cache directory, counted from the files themselves
    for chunk in cache.rglob("chunk-*.npz"):
        with np.load(chunk) as stored:
            cached[chunk.parent] = cached.get(chunk.parent, 0) + len(stored["rows"])
    assert sorted(cached.values()) == [12, 40]

    status, text = in_process(resume_argv(line))  # the interrupted run was the process that had to end
    assert status == 0, text[-3000:]
    said = re.findall(r"resuming: (\d+) of (\d+) rows scored with the (\w+) model", text)
    assert sorted((int(done), int(total)) for done, total, _ in said) == [(12, 40), (40, 40)], text
    scored = Dataset.load_from_disk(str(out))
    for column in score_setup["reference"].column_names:
        np.testing.assert_array_equal(scored[column], score_setup["reference"][column], err_msg=column)
    assert [p for p in cache.rglob("*") if staging_owner(p) is not None] == []


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_an_interrupted_patch_all_leaves_nothing_and_its_command_reruns(patch_setup, tmp_path, signal_name):
    out = tmp_path / "out"
    arguments = {"config": patch_setup["config"], "out": str(out), "overwrite": False, "all_sizes": True}
    point = ["--signal", signal_name, "kinfolk.plugins.adapt.execute:materialise", "before", "5"]
    line = stopped_line(signalled_job(tmp_path, "merge", arguments, *point), "merge", signal_name)
    assert f"nothing at {out}" in line
    assert not out.exists()
    assert staging_left(tmp_path) == []  # removed at once, not left for the next run as a SIGKILL leaves it
    status, text = in_process(resume_argv(line))
    assert status == 0, text[-3000:]
    assert_same_files(out, patch_setup["reference"])


def test_an_interrupted_lab_experiment_keeps_finished_runs_and_resumes_from_them(tmp_path, monkeypatch):
    """The command's wiring and its resume line, with a stub for each family's run (kept as the maker keeps it)."""
    from kinfolk.atomic import write_json
    from kinfolk.lab.experiments.atlas_controls.experiment import AtlasControls
    from kinfolk.lab.experiments.atlas_controls.runs import AtlasControlsRuns

    ran = []

    def record(self, family: int, run: int) -> dict:
        ran.append(family)
        if len(ran) == 2 and family == 1:  # the first run of the command: stopped during its second family
            os.kill(os.getpid(), signal.SIGTERM)
        kept = {"record_version": AtlasControlsRuns.record_version, "family": family}
        write_json(Path(self.settings.records) / str(family) / f"{run}.json", kept)
        return kept

    monkeypatch.setattr(AtlasControlsRuns, "record", record)
    monkeypatch.chdir(tmp_path)  # the settings keep records and work relative to the working directory
    settings = AtlasControls().settings
    argv = ["lab", "experiment", "atlas-controls", "run", "--families", "0", "1", "2", "--runs", "0"]

    status, text = in_process(argv)
    assert status == 143, text
    line = text.strip().splitlines()[-1]
    assert line == (
        f"kinfolk lab: stopped by SIGTERM; kept: every whole run's record in {settings.records} and each run's "
        f"finished parts under {settings.work}; log: {Path('runs', 'atlas-controls', f'run-{os.getpid()}.log')}; "
        f"resume: kinfolk {shlex.join(argv)}"
    )
    assert sorted(p.parent.name for p in Path(settings.records).glob("*/0.json")) == ["0"]
    status, text = in_process(argv)
    assert status == 0, text
    assert ran == [0, 1, 1, 2]  # family 0's kept record was read back, not made again
    assert not Path(settings.records, "0", "1.json").exists()  # only the runs asked for


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_an_interrupted_distil_stops_its_processes_and_resumes_from_the_last_checkpoint(
    tiny_kit, tmp_path, signal_name
):
    import time

    import psutil

    from kinfolk.testing import prompt_completion_dataset

    data = tmp_path / "sft.jsonl"
    prompt_completion_dataset(16).to_json(str(data))
    out = tmp_path / "out"
    argv = ["distil", "--teacher", str(tiny_kit.model_dir("llama", "large")), "--sft_data", str(data)]
    argv += ["--out", str(out), "--use_cpu", "--bf16", "false", "--report_to", "none", "--seed", "0"]
    argv += ["--per_device_train_batch_size", "2", "--max_steps", "60", "--save_steps", "2", "--save_total_limit", "1"]
    command = [sys.executable, "-m", "kinfolk", *argv]
    process = subprocess.Popen(command, env=ENVIRONMENT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list((out / "training").glob("checkpoint-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(getattr(signal, signal_name))
    stdout, stderr = process.communicate(timeout=180)
    line = stopped_line(
        subprocess.CompletedProcess(command, process.returncode, stdout, stderr), "distil", signal_name
    )
    assert line.endswith("--resume_from_checkpoint true") and f"checkpoints under {out / 'training'}" in line
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]
    assert not (out / "distilled").exists()
    step = last_checkpoint_step(out / "training")
    assert 0 < step < 60

    resumed = run_resume_command(line)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming: {step} of 60 steps done" in resumed.stderr
    assert (out / "delta").is_dir() and (out / "distilled").is_dir()


@pytest.mark.slow
def test_an_interrupted_sft_says_it_keeps_its_checkpoints_and_resumes_from_the_last(tiny_kit, tmp_path):
    import time

    from kinfolk.testing import prompt_completion_dataset

    data = tmp_path / "train.jsonl"
    prompt_completion_dataset(16).to_json(str(data))
    out = tmp_path / "sft"
    argv = ["sft", "--model_name_or_path", str(tiny_kit.model_dir("llama", "large")), "--dataset_name", str(data)]
    argv += ["--output_dir", str(out), "--weight_column", "none", "--use_cpu", "--report_to", "none", "--seed", "0"]
    argv += ["--max_steps", "60"]
    argv += ["--per_device_train_batch_size", "2", "--save_steps", "2", "--save_total_limit", "1"]
    command = [sys.executable, "-m", "kinfolk", *argv]
    process = subprocess.Popen(command, env=ENVIRONMENT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(out.glob("checkpoint-*")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=180)
    line = stopped_line(subprocess.CompletedProcess(command, process.returncode, stdout, stderr), "sft", "SIGTERM")
    assert line.endswith("--resume_from_checkpoint true") and f"checkpoints under {out}" in line
    step = last_checkpoint_step(out)
    assert 0 < step < 60

    resumed = run_resume_command(line)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming: {step} of 60 steps done" in resumed.stderr
    assert (out / "model.safetensors").is_file()


def test_an_interrupted_lab_build_keeps_the_trained_models_and_resumes_after_them(tmp_path, monkeypatch):
    """The command's line and the build's resume line, with each model's training replaced by a save of its init
    (and its scores by a stub): SIGTERM while the third of the five models trains."""
    from transformers import AutoModelForCausalLM

    import kinfolk.lab.world.family as family_module
    from kinfolk.lab.world.skills import SKILLS
    from kinfolk.lab.world.training import save_model

    trained = []

    def train(model, dataset, tokenizer, out, *args, **kwargs):
        trained.append(out.name)
        if len(trained) == 3 and out.name == "small_instruct":  # the first run: stopped during its third model
            os.kill(os.getpid(), signal.SIGTERM)
        model = AutoModelForCausalLM.from_pretrained(model) if isinstance(model, Path) else model
        save_model(model, tokenizer, out)
        return 1

    perfect = {skill: {"accuracy": 1.0, "answer_accuracy": 1.0} for skill in SKILLS}
    monkeypatch.setattr(family_module, "train", train)
    monkeypatch.setattr(family_module, "skill_scores", lambda *args, **kwargs: perfect)
    cache = tmp_path / "cache"
    argv = ["lab", "build", "--quick", "--cache_dir", str(cache)]
    root = cache / family_module.LabConfig.quick_config(seed=0).cache_key()

    status, text = in_process(argv)
    assert status == 143, text
    assert text.strip().splitlines()[-1] == (
        f"kinfolk lab: stopped by SIGTERM; kept: every model trained to its end, in {root} (a model stopped while "
        f"training is trained again); log: {cache / (root.name + '.run.log')}; resume: kinfolk {shlex.join(argv)}"
    )
    assert sorted(path.name for path in root.iterdir() if (path / "config.json").exists()) == [
        "large_base",
        "small_base",
    ]
    status, text = in_process(argv)
    assert status == 0, text
    assert f"resuming: 2 of 5 models trained earlier in {root}" in " ".join(text.split())  # wrapped at 100
    assert trained == [
        "small_base",
        "large_base",
        "small_instruct",
        "small_instruct",
        "large_instruct",
        "large_bracket",
    ]
