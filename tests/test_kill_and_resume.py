"""Crash safety, measured with real SIGKILLs: `kinfolk merge patch --all`, `kinfolk score`, `kinfolk compare` (through
the command line) and SFT checkpointing killed at several points leave the destination whole or absent, the next run
leaves nothing behind, and its result equals an uninterrupted run's. Also: how much work a killed scoring run loses
(resume granularity), before and after token-sized chunks.

Only the killed runs need a process of their own (tests/kill_jobs.py); the reruns and the uninterrupted references
call the same jobs in this process.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from compare_helpers import compare_inputs, measurements
from datasets import Dataset
from kill_helpers import ENVIRONMENT, JOBS, assert_same_files, staging_left
from kill_jobs import JOBS as JOB_FUNCTIONS
from two_process_helpers import accelerate_flags

from kinfolk.atomic import staging_owner
from kinfolk.plugins.adapt import merge
from kinfolk.plugins.atlantis import ScoreConfig, score_model
from kinfolk.plugins.atlantis import scoring as scoring_module
from kinfolk.testing import prompt_completion_dataset


def run_job(tmp_path, job: str, arguments: dict, *kill: str, launcher: tuple[str, ...] = ()) -> int:
    spec = tmp_path / f"{job}-{len(list(tmp_path.glob('*.json')))}.json"
    spec.write_text(json.dumps(arguments, default=str))
    command = (
        [*launcher, str(JOBS), job, str(spec), *kill]
        if launcher
        else [sys.executable, str(JOBS), job, str(spec), *kill]
    )
    done = subprocess.run(command, env=ENVIRONMENT, capture_output=True, text=True, timeout=600, cwd=JOBS.parent)
    if done.returncode not in (0, -9):
        raise AssertionError(done.stderr[-4000:])
    return done.returncode


# --- merge patch --all ------------------------------------------------------------------------------------------


MERGE_KILLS = {
    "while computing tensors": (False, ["kinfolk.plugins.adapt.execute:materialise", "before", "5"], "absent"),
    "after a shard is written": (False, ["kinfolk.tensors:ShardedWriter._flush", "after", "2"], "absent"),
    "before publishing": (False, ["kinfolk.atomic:publish", "before", "1"], "absent"),
    "overwrite, while computing": (True, ["kinfolk.plugins.adapt.execute:materialise", "before", "3"], "old"),
    "overwrite, after the exchange": (True, ["kinfolk.atomic:exchange", "after", "1"], "new"),
    "overwrite without exchange, between renames": (
        True,
        ["pathlib:Path.rename", "after", "1", "/out", "--no-exchange"],
        "missing, old restorable",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("point", list(MERGE_KILLS))
def test_killed_patch_all_leaves_a_whole_or_no_output_and_the_rerun_cleans_up(patch_setup, tmp_path, point):
    overwrite, kill, expected = MERGE_KILLS[point]
    out = tmp_path / "out"
    if overwrite:
        merge({**patch_setup["config"], "num_patched": 1}, out, progress=False)
    arguments = {"config": patch_setup["config"], "out": str(out), "overwrite": overwrite, "all_sizes": True}
    assert run_job(tmp_path, "merge", arguments, "--kill", *kill) == -9
    if expected == "absent":
        assert not out.exists()
    elif expected == "old":
        assert_same_files(out, patch_setup["old"])
    elif expected == "new":
        assert_same_files(out, patch_setup["reference"])
    else:
        assert not out.exists() and any(staging_owner(p)[1] == "old" for p in tmp_path.iterdir() if staging_owner(p))
    assert staging_left(tmp_path), "the killed writer's staging should be there for the next run to remove"
    merge(patch_setup["config"], out, overwrite=overwrite or out.exists(), all_sizes=True, progress=False)
    assert staging_left(tmp_path) == []
    assert_same_files(out, patch_setup["reference"])


# --- scoring --------------------------------------------------------------------------------------------------


SCORE_KILLS = {
    "after 3 chunks of the second model": ["kinfolk.plugins.atlantis.cache:ScoreCache.write", "after", "13"],
    "while a chunk is renamed into place": ["os:replace", "before", "4", ".npz"],
    "while the output is published": ["kinfolk.atomic:publish", "before", "1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("point", list(SCORE_KILLS))
def test_killed_scoring_resumes_from_whole_chunks_and_equals_an_uninterrupted_run(score_setup, tmp_path, point):
    cache, out = tmp_path / "cache", tmp_path / "scored"
    arguments = {**score_setup, "cache_dir": str(cache), "out": str(out), "overwrite": False}
    del arguments["reference"]
    assert run_job(tmp_path, "score", arguments, "--kill", *SCORE_KILLS[point]) == -9
    assert not out.exists()
    for chunk in cache.rglob("chunk-*.npz"):  # every chunk on disk is whole
        with np.load(chunk) as stored:
            assert len(stored["rows"]) == len(stored["logprob"])
    JOB_FUNCTIONS["score"](arguments)  # the rerun: in this process, as the killed run's process is gone anyway
    resumed = Dataset.load_from_disk(str(out))
    for column in score_setup["reference"].column_names:
        np.testing.assert_array_equal(resumed[column], score_setup["reference"][column], err_msg=column)
    leftovers = [p for p in cache.rglob("*") if staging_owner(p) is not None] + staging_left(tmp_path)
    assert leftovers == []


# --- compare ---------------------------------------------------------------------------------------------------


def compare_argv(inputs: dict[str, Path], out: Path) -> list[str]:
    return [
        "--model_name_or_path", inputs["model"], "--dataset_name", inputs["target"], "--retained_dataset_name",
        inputs["retained"], "--out", out, "--use_cpu", "--methods", "lora", "atlas", "--learning_rates", "3e-2",
        "--seeds", "0", "--max_steps", "12", "--eval_steps", "3", "--per_device_train_batch_size", "4", "--rank", "4",
        "--atlas_regions", "2", "--atlas_directions", "2", "--churn_tokens", "4",
    ]  # fmt: skip


@pytest.mark.slow
def test_a_killed_compare_run_resumes_from_its_last_checkpoint_and_equals_an_uninterrupted_one(tiny_kit, tmp_path):
    inputs = compare_inputs(tiny_kit, tmp_path / "inputs")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert run_job(tmp_path, "compare", {"argv": compare_argv(inputs, straight)}) == 0
    # LoRA's run publishes checkpoints 3, 6 and 9; the fifth publish is ATLAS's checkpoint-6, killed before the
    # older one is rotated away and before its seconds are written
    publish = ["kinfolk.trainers.atomic_checkpoints:publish", "after", "5"]
    assert run_job(tmp_path, "compare", {"argv": compare_argv(inputs, killed)}, "--kill", *publish) == -9
    atlas = killed / "runs" / "atlas" / "lr-0.03" / "seed-0"
    assert sorted(p.name for p in atlas.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    assert not (atlas / "run.json").exists() and sorted(measurements(atlas)) == [0, 3, 6]
    assert run_job(tmp_path, "compare", {"argv": compare_argv(inputs, killed)}) == 0
    for method in ("lora", "atlas"):
        run = Path("runs", method, "lr-0.03", "seed-0")
        assert measurements(killed / run) == measurements(straight / run), method
    assert not list(atlas.glob("checkpoint-*")) and staging_left(atlas) == []
    log = " ".join((killed / "run.log").read_text().split())  # stage lines wrap at 100 columns
    assert "atlas lr=0.03 seed=0: " in log and "(resumed from checkpoint-6)" in log


# --- SFT checkpoints ---------------------------------------------------------------------------------------------


def sft_parameters(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path)["parameters"]


@pytest.fixture(scope="module")
def sft_reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill-sft")
    JOB_FUNCTIONS["sft"]({"run_dir": str(root / "run"), "steps": 6, "out": str(root / "final.pt")})
    return root


SFT_KILLS = {
    "saving checkpoint 4, after the model, before the optimizer": (
        ["transformers.trainer:Trainer._save_optimizer_and_scheduler", "before", "2"],
        ["checkpoint-2"],
    ),
    "saving checkpoint 4, after its RNG state": (
        ["transformers.trainer:Trainer._save_rng_state", "after", "2"],
        ["checkpoint-2"],
    ),
    "after checkpoint 4 is published, before rotation": (
        ["kinfolk.trainers.atomic_checkpoints:publish", "after", "2"],
        ["checkpoint-2", "checkpoint-4"],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("point", list(SFT_KILLS))
def test_killed_checkpointing_leaves_whole_checkpoints_and_resumes_bit_exact(sft_reference, tmp_path, point):
    kill, whole = SFT_KILLS[point]
    run = tmp_path / "run"
    arguments = {"run_dir": str(run), "steps": 6, "out": str(tmp_path / "final.pt")}
    assert run_job(tmp_path, "sft", arguments, "--kill", *kill) == -9
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("checkpoint-")) == whole
    for checkpoint in whole:  # whole: everything a resume reads
        names = {p.name for p in (run / checkpoint).iterdir()}
        assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth"} <= names
    assert staging_left(run), "the killed save's staging should be there for the next run to remove"
    JOB_FUNCTIONS["sft"]({**arguments, "resume": True})
    assert staging_left(run) == []
    resumed, straight = sft_parameters(tmp_path / "final.pt"), sft_parameters(sft_reference / "final.pt")
    assert resumed.keys() == straight.keys()
    for name in resumed:
        assert torch.equal(resumed[name], straight[name]), name


@pytest.mark.slow
def test_two_processes_publish_one_whole_checkpoint_with_both_rng_states(tmp_path):
    launcher = (sys.executable, "-m", "accelerate.commands.launch", *accelerate_flags())
    arguments = {"run_dir": str(tmp_path / "run"), "steps": 2, "out": str(tmp_path / "final.pt")}
    run_job(tmp_path, "sft", arguments, launcher=launcher)
    run = tmp_path / "run"
    assert [p.name for p in run.iterdir() if p.name.startswith("checkpoint-")] == ["checkpoint-2"]
    assert staging_left(run) == []
    names = {p.name for p in (tmp_path / "run" / "checkpoint-2").iterdir()}
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "trainer_state.json"} <= names


# --- resume granularity ----------------------------------------------------------------------------------------


class Interrupted(Exception):
    pass


def rows_lost_by_a_kill(dataset, model_dir, config, kill_after_rows, monkeypatch) -> tuple[int, int]:
    """(rows scored before the interruption that the rerun scores again, rows the rerun scores in all)."""
    original, counted = scoring_module.score_batches, {"run": 0, "first": 0, "second": 0}

    def counting(model, input_ids, labels, batches, *args, **kwargs):
        for result in original(model, input_ids, labels, batches, *args, **kwargs):
            key = "first" if counted["run"] == 0 else "second"
            counted[key] += len(result[0])
            if key == "first" and counted[key] >= kill_after_rows:
                raise Interrupted  # as a kill: what is cached is exactly the chunks written so far
            yield result

    monkeypatch.setattr(scoring_module, "score_batches", counting)
    with pytest.raises(Interrupted):
        score_model(dataset, model_dir, "small_base", config)
    counted["run"] = 1
    score_model(dataset, model_dir, "small_base", config)
    return counted["first"] + counted["second"] - len(dataset), counted["second"]


@pytest.mark.slow
def test_a_killed_default_run_loses_at_most_a_small_fraction(tiny_kit, tmp_path, monkeypatch):
    """Default chunking: at random kill points a rerun recomputes at most 1/32 of the rows (the fixed 1024-row
    chunks it replaced lost everything done in the current chunk: up to all rows of a run under 1024 rows)."""
    dataset = prompt_completion_dataset(3000, seed=11)
    model_dir = tiny_kit.model_dir("qwen2")
    rng = random.Random(0)
    kill_points = [rng.randrange(100, len(dataset)) for _ in range(3)]
    lost = {"token-sized chunks (default)": [], "1024-row chunks (before)": []}
    for index, kill in enumerate(kill_points):
        for label, options in (
            ("token-sized chunks (default)", {}),
            ("1024-row chunks (before)", {"chunk_rows": 1024, "chunk_tokens": 10**9}),
        ):
            config = ScoreConfig(cache_dir=str(tmp_path / f"{index}-{len(options)}"), **options)
            lost[label].append(rows_lost_by_a_kill(dataset, model_dir, config, kill, monkeypatch)[0])
    print(json.dumps({"rows": len(dataset), "kill_after_rows": kill_points, "rows_lost": lost}))
    assert max(lost["token-sized chunks (default)"]) <= len(dataset) / 32
    assert max(lost["1024-row chunks (before)"]) > len(dataset) / 10  # what the old default lost at the same points


def test_a_launched_verb_that_succeeded_ends_its_process_group(tmp_path):
    """`kinfolk.commands.run` destroys the default process group after a successful call, and not after a failure
    (a barrier would wait for ranks that are gone): a rank must not leave gloo's threads to the interpreter's exit."""
    import torch.distributed as dist

    from kinfolk.commands import run
    from kinfolk.errors import InputError

    def bad_input():
        raise InputError("no such row")

    for call, code, alive_after in ((bad_input, 2, True), (lambda: 0, 0, False)):
        if not dist.is_initialized():
            store = dist.FileStore(str(tmp_path / "store"), 1)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        assert run("kinfolk test", call) == code
        assert dist.is_initialized() is alive_after


def test_ending_a_trainer_waits_for_every_rank_then_calls_its_end(tmp_path, monkeypatch):
    """`end_training` puts a barrier before `Trainer.end()` (which destroys the group at once), and needs no group."""
    import torch.distributed as dist

    from kinfolk.process_group import end_training

    events = []

    class Ending:
        accelerator = type("Accelerator", (), {"free_memory": lambda self: events.append("free")})()
        model = model_wrapped = None

        def end(self):
            events.append("end")

    monkeypatch.setattr(dist, "barrier", lambda *args, **kwargs: events.append("barrier"))
    end_training(Ending())  # no process group: nothing to wait for
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        end_training(Ending())
    finally:
        dist.destroy_process_group()
    assert events == ["free", "end", "free", "barrier", "end"]
