"""What the lab's tests share: the micro family settings (a few steps of everything: the plumbing, not the skills),
a micro experiment's run through the protocol's runner, and the committed results recomputed without training.

The micro families themselves are built once per test session, in the session's lab cache (keyed by config hash):
the `micro_family` fixture in conftest.py and `run_micro`, whose experiments build theirs there too."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kinfolk.lab.protocol.experiment import Experiment
from kinfolk.lab.protocol.plan import write_plan
from kinfolk.lab.protocol.runner import run_experiment

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"

# A few steps of everything: the build's plumbing, not its skills.
MICRO = {
    "small_pretrain_steps": 3,
    "large_pretrain_steps": 3,
    "post_train_steps": 2,
    "batch_size": 4,
    "eval_problems": 4,
    "small_shape": {"num_hidden_layers": 2, "hidden_size": 16, "intermediate_size": 32},
    "large_shape": {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64},
    "thresholds": {},
}
# ADAPT's micro family: a 4-layer teacher, so a student of every other layer plus the last patches back through k = 0..3
MICRO_ADAPT = MICRO | {"large_shape": {"num_hidden_layers": 4, "hidden_size": 32, "intermediate_size": 64}}


def run_recording_trainings(experiment: Experiment, protocol: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(what each `distil_student` call was given, the results) of `experiment` through the protocol's runner under a
    plan written as `plan` writes it, in the folder `protocol`: per call the student folder's name (`out`), the
    training arguments (`args`) and the rows (`rows`: pre-training texts, SFT prompts)."""
    from kinfolk.plugins.adapt import distillation

    calls = []
    train = distillation.distil_student

    def recording(teacher, out, layers, args, pretraining=None, sft=None):
        calls.append({"out": Path(out).name, "args": args, "rows": (pretraining["text"], sft["prompt"])})
        return train(teacher, out, layers, args, pretraining=pretraining, sft=sft)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(distillation, "distil_student", recording)
        plan = protocol / f"{experiment.name}.plan.json"
        write_plan(experiment.plan(**experiment.plan_fields()), plan)
        results = run_experiment(experiment, plan, protocol / "work")
    return calls, results


def run_micro(experiment: Experiment, lab_cache: Path, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(unit 0 run 0's kept record, the results) of a family-runs `experiment` through the runner, under a plan
    written as `plan` writes it, its families built (or found) in the session's `lab_cache`; the settings' records
    folder must be `tmp_path / "records"`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KINFOLK_LAB_CACHE", str(lab_cache))
        plan_file = tmp_path / "plan.json"
        write_plan(experiment.plan(**experiment.plan_fields()), plan_file)
        results = run_experiment(experiment, plan_file, tmp_path / "protocol")
    return json.loads((tmp_path / "records" / "0" / "0.json").read_text()), results


@contextlib.contextmanager
def no_training() -> Iterator[None]:
    """Inside, any training (a Trainer's `train`: a family's model, an adapter, a student) fails the test: what is
    read must have been kept."""
    from transformers import Trainer

    def refuse(*args, **kwargs):
        raise AssertionError("a record was missing and started training instead of being read")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "train", refuse)
        yield


def committed(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())
