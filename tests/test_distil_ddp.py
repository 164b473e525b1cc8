"""LayerDistillationTrainer and `kinfolk distil` under two gloo processes give one process's losses and student;
the teacher is frozen, in eval mode and not wrapped for training on every rank. See tests/distil_ddp_job.py."""

import json
import sys
from pathlib import Path

import pytest
import torch
from distil_ddp_job import OPTIONS, digest, losses, train_once
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from two_process_helpers import accelerate, accelerate_flags, run
from yaml import safe_dump

from kinfolk.commands.distil import DELTA, DISTILLED, INIT, DistilArguments, distil
from kinfolk.plugins.adapt import LayerMap
from kinfolk.testing import prompt_completion_dataset, text_dataset
from kinfolk.trainers import LayerDistillationConfig

JOB = Path(__file__).with_name("distil_ddp_job.py")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("two-processes")]


def test_two_processes_give_the_losses_and_student_of_one_process(distil_pair):
    teacher, student, root = distil_pair
    (root / "ddp").mkdir()
    accelerate(JOB, teacher, student, str(root / "ddp"))
    ranks = [torch.load(root / "ddp" / f"rank{rank}.pt") for rank in (0, 1)]
    single = train_once(teacher, student, str(root / "single"), processes=1)
    initial = dict(AutoModelForCausalLM.from_pretrained(student).named_parameters())
    expected = {name: value.detach() for name, value in single.model.named_parameters()}
    teacher_digest = digest(AutoModelForCausalLM.from_pretrained(teacher))
    for record in ranks:
        assert (record["num_processes"], record["backend"]) == (2, "gloo")
        assert record["student_type"] == "DistributedDataParallel"
        # the teacher: the plain model (not DDP), eval mode, nothing trainable, weights as loaded
        assert record["teacher_type"] == "LlamaForCausalLM"
        assert (record["teacher_training"], record["teacher_trainable"]) == (False, 0)
        assert record["teacher_digest"] == teacher_digest
        logged = losses(single)
        assert len(record["losses"]) == len(logged) == OPTIONS["max_steps"]
        for step, (ours, reference) in enumerate(zip(record["losses"], logged)):
            assert ours["loss"] == pytest.approx(reference["loss"], rel=1e-5), step
            # distill/* are means over a step's micro-batches of each (rank-pooled) micro-batch's token mean, as TRL
            # logs entropy: 2 pooled micro-batches here, 4 in one process, so they differ by ~1 %; the loss is exact
            assert ours["distill/kl"] > 0 and ours["distill/cosine_distance"] > 0
        # the update (trained − initial), which is what DDP and gradient accumulation must agree on
        assert record["parameters"].keys() == expected.keys()
        moved = 0
        for name, value in expected.items():
            update = value - initial[name].detach()
            torch.testing.assert_close(
                record["parameters"][name] - initial[name].detach(), update, rtol=1e-4, atol=1e-7
            )
            moved += bool(update.abs().max() > 1e-4)
        assert moved > len(expected) // 2


def test_kinfolk_distil_under_two_processes_gives_the_one_process_student(distil_pair, tmp_path):
    """`kinfolk distil` from a YAML config under two gloo processes with gradient accumulation, the paper's two
    phases: its student is the one-process student, and every output is written once, by the main process."""
    teacher, _, _ = distil_pair
    text_dataset(8, seed=1).to_json(tmp_path / "pretraining.jsonl")
    prompt_completion_dataset(8).to_json(tmp_path / "sft.jsonl")
    training = {key: value for key, value in OPTIONS.items() if key != "disable_tqdm"}
    config = {"teacher": teacher, "layers": "{layers: [0, 2]}", "pretraining_data": str(tmp_path / "pretraining.jsonl"),
              "sft_data": str(tmp_path / "sft.jsonl"), "gradient_accumulation_steps": 2, **training,
              "save_strategy": "steps", "save_steps": 4}  # fmt: skip
    (tmp_path / "distil.yaml").write_text(safe_dump(config))
    kinfolk = str(Path(sys.executable).with_name("kinfolk"))
    two = tmp_path / "two"
    run([kinfolk, "distil", "--config", str(tmp_path / "distil.yaml"), "--out", str(two), *accelerate_flags()])
    state = json.loads((two / "training" / "checkpoint-4" / "trainer_state.json").read_text())
    logged = [row for row in state["log_history"] if "loss" in row]
    # 4 steps × 2 processes × 2 rows × 2 micro-batches: one pass of the phase sampler, 2 steps of each phase
    assert len(logged) == 4 and state["log_history"][-1]["epoch"] == pytest.approx(1.0)
    assert all(row["distill/kl"] > 0 for row in logged)
    assert LayerMap.load(two / DISTILLED).blocks == ((0, 2), (2, 4))
    distilled, initial = (load_file(two / name / "model.safetensors") for name in (DISTILLED, INIT))
    delta = load_file(two / DELTA / "model.safetensors")
    for name, value in distilled.items():
        torch.testing.assert_close(delta[name], value - initial[name], rtol=0, atol=0, msg=name)

    arguments = DistilArguments(teacher=teacher, out=str(tmp_path / "one"), layers="{layers: [0, 2]}")
    one = distil(
        arguments,
        LayerDistillationConfig(output_dir="ignored", **{**training, "gradient_accumulation_steps": 4}),
        text_dataset(8, seed=1),
        prompt_completion_dataset(8),
    )
    reference, reference_initial = (load_file(path / "model.safetensors") for path in (one, tmp_path / "one" / INIT))
    assert distilled.keys() == reference.keys()
    moved = 0
    for name, value in reference.items():
        update = value - reference_initial[name]
        torch.testing.assert_close(distilled[name] - initial[name], update, rtol=1e-4, atol=1e-7, msg=name)
        moved += bool(update.abs().max() > 1e-4)
    assert moved > len(reference) // 2
