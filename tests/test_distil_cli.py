"""`kinfolk distil`: the same student as the merges and the trainer run by hand, its delta and its errors. Its
two-process launch with gradient accumulation is in tests/test_distil_ddp.py."""

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from kinfolk.commands import main as kinfolk_main
from kinfolk.commands.distil import DELTA, DISTILLED, INIT, DistilArguments, distil
from kinfolk.plugins.adapt import LayerMap, merge
from kinfolk.testing import prompt_completion_dataset, text_dataset
from kinfolk.trainers import LayerDistillationConfig, LayerDistillationTrainer

TRAINING = {"use_cpu": True, "bf16": False, "report_to": [], "per_device_train_batch_size": 4, "max_steps": 4,
            "save_strategy": "no", "logging_steps": 1, "seed": 0, "disable_tqdm": True}  # fmt: skip


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


def test_distil_is_init_student_then_the_trainer_then_the_delta(tiny_kit, tmp_path):
    teacher = tiny_kit.model_dir("llama", "large")
    pretraining, sft = text_dataset(8, seed=1), prompt_completion_dataset(8)
    args = DistilArguments(teacher=str(teacher), out=str(tmp_path / "out"))
    distilled = distil(args, LayerDistillationConfig(output_dir="ignored", **TRAINING), pretraining, sft)

    out = tmp_path / "out"
    assert distilled == out / DISTILLED
    # by hand: the paper's selection (every other layer, the last kept), then the trainer with the same options
    init = merge({"op": "init-student", "teacher": str(teacher), "layers": {"every": 2, "last": 1}},
                 tmp_path / "init", progress=False)  # fmt: skip
    assert LayerMap.load(out / INIT) == LayerMap.load(init) == LayerMap.load(distilled)
    assert LayerMap.load(init).blocks == ((0, 2), (2, 3), (3, 4))
    trainer = LayerDistillationTrainer(
        model=str(init),
        teacher_model=str(teacher),
        args=LayerDistillationConfig(output_dir=str(tmp_path / "by-hand"), **TRAINING),
        train_dataset=sft,
        pretraining_dataset=pretraining,
        processing_class=AutoTokenizer.from_pretrained(init),
    )
    trainer.train()
    by_hand = {name: value.detach() for name, value in trainer.model.state_dict().items()}
    ours = _weights(distilled)
    assert ours.keys() == by_hand.keys()
    for name, value in ours.items():
        assert torch.equal(value, by_hand[name]), name
    # the delta is distilled − init, tensor by tensor
    delta, initial = _weights(out / DELTA), _weights(out / INIT)
    for name, value in ours.items():
        torch.testing.assert_close(delta[name], value - initial[name], rtol=0, atol=0, msg=name)
    assert not any(path.name.startswith(".") for path in out.iterdir())  # no staging left behind


def test_bad_input_is_refused_before_anything_runs(tiny_kit, tmp_path, capsys):
    teacher = str(tiny_kit.model_dir("llama", "large"))
    (tmp_path / "taken").mkdir()
    capsys.readouterr()  # the kit's own progress lines
    common = ["--teacher", teacher, "--sft_data", "d.jsonl", "--use_cpu"]
    cases = [
        ([*common, "--out", str(tmp_path / "taken")], "already exists"),
        ([*common, "--out", str(tmp_path / "new"), "--layers", "{every: 0}"], "every: expected a positive integer"),
        ([*common, "--out", str(tmp_path / "new"), "--layers", "[0, 2]"], "--layers expects a mapping"),
        (["--teacher", teacher, "--out", str(tmp_path / "new"), "--use_cpu"], "give --sft_data, --pretraining_data"),
    ]
    for argv, message in cases:
        try:
            code = kinfolk_main(["distil", *argv])
        except SystemExit as exited:  # errors found while parsing exit through argparse
            code = exited.code
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "new").exists()


def test_bad_teachers_data_and_checkpoints_are_refused_before_any_process_starts(tiny_kit, tmp_path, monkeypatch):
    """Each refusal: exit 2, one line naming the culprit, nothing at --out, the inputs untouched, and no process
    launched (so `--overwrite` has cleared nothing)."""
    from refusal_helpers import assert_command_refused

    import kinfolk.commands.distil as distil_command

    def no_launch(*args, **kwargs):
        raise AssertionError("accelerate launch started before the bad input was refused")

    monkeypatch.setattr(distil_command, "launch", no_launch)
    teacher = tiny_kit.model_dir("llama", "large")
    prompt_completion_dataset(4).to_json(tmp_path / "sft.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "no-sft-columns.jsonl").write_text('{"question": "1 + 1?", "answer": "2"}\n')
    (tmp_path / "a-file").write_text("not a model")
    (tmp_path / "not-a-checkpoint").mkdir()
    out = tmp_path / "out"
    sft = ["--sft_data", tmp_path / "sft.jsonl", "--use_cpu"]
    common = ["distil", "--teacher", teacher, "--out", out, "--use_cpu"]
    cases = [
        (["distil", "--teacher", tmp_path / "gone", "--out", out, *sft], ["gone", "no such directory"]),
        (["distil", "--teacher", tmp_path / "a-file", "--out", out, *sft], ["a-file", "is a file"]),
        ([*common, *sft, "--layers", "{first: 9}"], ["--layers", "first: 9 is more than the teacher's 4 layers"]),
        ([*common, *sft, "--layers", "{every: [1"], ["--layers", "is not valid YAML"]),
        ([*common, "--sft_data", tmp_path / "missing.jsonl"], ["missing.jsonl", "no such data file"]),
        ([*common, "--pretraining_data", tmp_path / "empty.jsonl", *sft], ["empty.jsonl", "is empty"]),
        (
            [*common, "--sft_data", tmp_path / "no-sft-columns.jsonl"],
            [
                "--sft_data",
                "no-sft-columns.jsonl: the dataset has none of the SFT column sets",
                "['answer', 'question']",
            ],
        ),
        ([*common, *sft, "--resume_from_checkpoint", tmp_path / "not-a-checkpoint"], ["not a checkpoint"]),
        ([*common, *sft, "--resume_from_checkpoint", tmp_path / "nowhere"], ["nowhere", "no such checkpoint"]),
    ]
    inputs = [tmp_path / "sft.jsonl", teacher / "config.json"]
    for argv, named in cases:
        assert_command_refused(argv, *named, destination=out, inputs=inputs)
    # an existing --out with --overwrite and a bad input: refused, and the old output is still there
    out.mkdir()
    (out / "kept").write_text("old output")
    assert_command_refused([*common, "--overwrite", "--sft_data", tmp_path / "missing.jsonl"], "missing.jsonl")
    assert (out / "kept").read_text() == "old output"


def test_reading_the_data_prints_nothing_of_the_libraries_on_the_terminal(tiny_kit, tmp_path, monkeypatch, capfd):
    """datasets' "Generating train split" lines, printed as the checks read the data before any process starts,
    stay off the terminal; the checks' log joins OUT/run.log, the log the launched processes write to."""
    import kinfolk.commands.distil as distil_command

    monkeypatch.setattr(distil_command, "launch", lambda *args, **kwargs: 0)  # the checks only, no training
    prompt_completion_dataset(4).to_json(tmp_path / "sft.jsonl")  # a file datasets has not cached
    out = tmp_path / "out"
    argv = ["distil", "--teacher", str(tiny_kit.model_dir("llama", "large")), "--out", str(out), "--use_cpu",
            "--sft_data", str(tmp_path / "sft.jsonl")]  # fmt: skip
    capfd.readouterr()  # the kit's own progress lines
    import importlib

    bars = importlib.import_module("datasets.utils.tqdm")  # the module (`datasets.utils.tqdm` names its class)

    # the bars on, as a user's terminal has them (the suite's conftest switches them off, with priority)
    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS")
    monkeypatch.setattr(bars, "HF_DATASETS_DISABLE_PROGRESS_BARS", None)
    monkeypatch.setattr(bars, "_hf_datasets_progress_bars_disabled", False)
    assert kinfolk_main(argv) == 0
    terminal = capfd.readouterr()
    assert terminal.out == "" and terminal.err.splitlines() == [f"wrote {out}: {INIT}/, {DISTILLED}/, {DELTA}/"]
    assert (out / "run.log").is_file()
