"""A stopped `kinfolk compare` resumes each interrupted run from its last measured step, and the resumed run's log
equals an uninterrupted run's (`kinfolk.compare.resume`).

One comparison runs uninterrupted; the same comparison in another folder is stopped in the middle of an ATLAS run
(an adapter with a fitted atlas), then of a LoRA + Output-KL run (a regulariser reading retained batches by step), then
of a full fine-tuning run (a checkpoint of every weight, the frozen model saved beside it), each resumed by the next
call of the same command. Every measurement of every run equals the uninterrupted one's, bit for bit (CPU, fp32).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from compare_helpers import compare_inputs, measurements

from kinfolk.commands import main
from kinfolk.compare import runs as compare_runs
from kinfolk.compare.resume import SITTINGS_FILE

METHODS = ("lora", "atlas", "lora_output_kl", "full")
STOPPED_AT = 7  # between the measured steps 6 and 9: the run resumes from checkpoint-6
STEPS = 12


class Stopped(BaseException):
    """Stands in for a kill: nothing in the command catches it."""


def argv(inputs: dict[str, Path], out: Path) -> list[str]:
    return [
        "compare", "--model_name_or_path", inputs["model"], "--dataset_name", inputs["target"],
        "--retained_dataset_name", inputs["retained"], "--out", out, "--use_cpu", "--methods", *METHODS,
        "--learning_rates", "3e-2", "--seeds", "0", "--max_steps", STEPS, "--eval_steps", "3",
        "--per_device_train_batch_size", "4", "--rank", "4", "--atlas_regions", "2", "--atlas_directions", "2",
        "--output_kl_coef", "1.0", "--churn_tokens", "4",
    ]  # fmt: skip


def run_folder(out: Path, method: str) -> Path:
    return out / "runs" / method / "lr-0.03" / "seed-0"


@pytest.fixture(scope="module")
def inputs(tiny_kit, tmp_path_factory) -> dict[str, Path]:
    return compare_inputs(tiny_kit, tmp_path_factory.mktemp("resume-inputs"))


def test_stopped_runs_resume_from_their_last_measurement_and_equal_uninterrupted_runs(inputs, tmp_path, monkeypatch):
    reference, resumed = tmp_path / "uninterrupted", tmp_path / "stopped"
    assert main([str(a) for a in argv(inputs, reference)]) == 0

    steps_taken: Counter = Counter()
    stop_in: list[str] = []  # the method whose run the next call stops
    counting = compare_runs._StepDone.on_step_end

    def step_end(self, args, state, control, **kwargs):
        method = Path(args.output_dir).parts[-3]
        steps_taken[method] += 1
        if stop_in and method == stop_in[0] and state.global_step == STOPPED_AT:
            raise Stopped
        return counting(self, args, state, control, **kwargs)

    monkeypatch.setattr(compare_runs._StepDone, "on_step_end", step_end)
    earlier_seconds = {}
    for method in METHODS[1:]:
        stop_in[:] = [method]
        steps_taken.clear()
        with pytest.raises(Stopped):
            main([str(a) for a in argv(inputs, resumed)])
        folder = run_folder(resumed, method)
        assert [p.name for p in folder.glob("checkpoint-*")] == ["checkpoint-6"]
        assert json.loads((folder / SITTINGS_FILE).read_text())["step"] == 6
        earlier_seconds[method] = json.loads((folder / SITTINGS_FILE).read_text())["seconds"]
        # the run stopped before was resumed by this call: only its steps after checkpoint-6 were taken again
        assert steps_taken[method] == STOPPED_AT
        before = METHODS[METHODS.index(method) - 1]
        assert steps_taken[before] == (STEPS - 6 if before != "lora" else STEPS)
    stop_in.clear()
    steps_taken.clear()
    assert main([str(a) for a in argv(inputs, resumed)]) == 0
    assert steps_taken == {"full": STEPS - 6}

    for method in METHODS:
        folder = run_folder(resumed, method)
        assert measurements(folder) == measurements(run_folder(reference, method)), method
        assert sorted(measurements(folder)) == [0, 3, 6, 9, 12]
        assert sorted(p.name for p in folder.iterdir()) == ["answers.jsonl", "drift.jsonl", "run.json"]  # logs only
        if method in earlier_seconds:  # the record counts every sitting's seconds
            assert json.loads((folder / "run.json").read_text())["seconds"] > earlier_seconds[method]
    assert (
        json.loads((resumed / "report" / "report.json").read_text())["verdicts"]
        == json.loads((reference / "report" / "report.json").read_text())["verdicts"]
    )
