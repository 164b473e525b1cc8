"""`kinfolk sft` and examples/sft_weighted.py: TRL's parser and YAML, the weight options, extension hooks, launches."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from peft import LoraConfig, PeftModel

from kinfolk.commands import main as kinfolk_main
from kinfolk.commands import sft as sft_cli
from kinfolk.testing import prompt_completion_dataset

ROOT = Path(__file__).resolve().parents[1]
TINY_RUN = [
    "--use_cpu",
    "--bf16", "False",
    "--gradient_checkpointing", "False",
    "--report_to", "none",
    "--save_strategy", "no",
    "--max_steps", "2",
    "--per_device_train_batch_size", "2",
    "--logging_steps", "1",
    "--disable_tqdm", "True",
]  # fmt: skip
CHECKPOINT_AT_END = ["--save_strategy", "steps", "--save_steps", "2"]
WEIGHTS = [0.5, 2.0, 1.0, 3.0, 0.0, 1.5, 1.0, 0.25]


@pytest.fixture
def weighted_json(tmp_path) -> Path:
    """A local dataset folder as `load_dataset(folder)` reads it offline."""
    folder = tmp_path / "data"
    folder.mkdir()
    data = prompt_completion_dataset(8).add_column("weight", WEIGHTS)
    data.to_json(folder / "train.jsonl")
    return folder


def _logged(output_dir: Path) -> list[dict]:
    """The log history of the launched run's last checkpoint (`CHECKPOINT_AT_END`)."""
    return json.loads((output_dir / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]


def test_help_lists_trl_flags_and_the_weight_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        kinfolk_main(["sft", "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    for flag in ("--model_name_or_path", "--dataset_name", "--use_peft", "--packing", "--weight_column",
                 "--weight_reduction", "--prompt_loss_weight", "--normalize_weights"):  # fmt: skip
        assert flag in shown


def test_the_example_yaml_parses_with_the_verbs_parser(tmp_path):
    parsed = sft_cli.make_parser().parse_args_and_config(
        ["--config", str(ROOT / "examples" / "sft_weighted.yaml"), "--output_dir", str(tmp_path), "--use_cpu"]
    )
    script_args, training_args, model_args, *_ = parsed
    assert (training_args.weight_column, training_args.prompt_loss_weight, training_args.weight_clip_max) == (
        "weight",
        0.1,
        5.0,
    )
    assert training_args.output_dir == str(tmp_path)  # the command line overrides the YAML
    assert model_args.model_name_or_path == "Qwen/Qwen2.5-0.5B" and script_args.dataset_train_split == "train"


def test_weight_column_none_on_the_command_line_switches_weights_off(tmp_path):
    parsed = sft_cli.make_parser().parse_args_and_config(
        ["--output_dir", str(tmp_path), "--use_cpu", "--model_name_or_path", "m", "--weight_column", "None"]
    )
    assert parsed[1].weight_column is None


@dataclass
class _TinyAdapterArguments:
    tiny_adapter_rank: int | None = field(default=None, metadata={"help": "rank of a test adapter"})


def test_an_extension_adds_flags_builds_the_adapter_and_sees_the_trainer(
    monkeypatch, tiny_kit, weighted_json, tmp_path
):
    prepared = []
    extension = sft_cli.SFTExtension(
        arguments=_TinyAdapterArguments,
        peft_config=lambda options, model_args: (
            LoraConfig(r=options.tiny_adapter_rank, target_modules=["o_proj"]) if options.tiny_adapter_rank else None
        ),
        prepare=lambda options, trainer: prepared.append(isinstance(trainer.model, PeftModel)),
    )
    monkeypatch.setattr(sft_cli, "EXTENSIONS", [extension])
    argv = [
        "--model_name_or_path", str(tiny_kit.model_dir("llama")),
        "--dataset_name", str(weighted_json),
        "--output_dir", str(tmp_path / "out"),
        "--tiny_adapter_rank", "3",
        "--prompt_loss_weight", "0.1",
        *TINY_RUN,
    ]  # fmt: skip
    trainer = sft_cli.train(*sft_cli.make_parser().parse_args_and_config(argv))
    assert prepared == [True]  # the hook ran on the built trainer, whose model already carries the adapter
    assert isinstance(trainer.model, PeftModel) and trainer.model.peft_config["default"].r == 3
    assert (tmp_path / "out" / "adapter_config.json").is_file()
    assert trainer.state.log_history[0]["weight/mean"] > 0
    with pytest.raises(ValueError, match="several adapters"):
        sft_cli.train(*sft_cli.make_parser().parse_args_and_config([*argv, "--use_peft"]))


def test_a_save_to_disk_folder_is_read_as_the_train_split(tmp_path):
    folder = tmp_path / "saved"
    prompt_completion_dataset(3).add_column("weight", [1.0, 2.0, 3.0]).save_to_disk(folder)
    script_args, _, _, dataset_args, *_ = sft_cli.make_parser().parse_args_and_config(
        ["--dataset_name", str(folder), "--output_dir", str(tmp_path), "--use_cpu"]
    )
    assert sft_cli.load_datasets(script_args, dataset_args)["train"]["weight"] == [1.0, 2.0, 3.0]


def _run(command: list[str]) -> None:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]


@pytest.mark.slow
def test_kinfolk_sft_launches_through_accelerate(tiny_kit, weighted_json, tmp_path):
    out = tmp_path / "out"
    kinfolk = Path(sys.executable).with_name("kinfolk")
    _run([
        str(kinfolk), "sft",
        "--model_name_or_path", str(tiny_kit.model_dir("qwen2")),
        "--dataset_name", str(weighted_json),
        "--output_dir", str(out),
        "--weight_reduction", "sequence",
        "--num_processes", "1",  # an `accelerate launch` flag, passed through
        *TINY_RUN, *CHECKPOINT_AT_END,
    ])  # fmt: skip
    assert (out / "model.safetensors").is_file()
    first = next(entry for entry in _logged(out) if "loss" in entry)
    assert {"entropy", "mean_token_accuracy", "num_tokens", "weight/mean", "weight/batch_ess"} <= first.keys()


@pytest.mark.slow
def test_the_example_runs_under_accelerate_launch_with_its_yaml(tiny_kit, weighted_json, tmp_path):
    out = tmp_path / "out"
    _run([
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1",
        str(ROOT / "examples" / "sft_weighted.py"),
        "--config", str(ROOT / "examples" / "sft_weighted.yaml"),
        "--model_name_or_path", str(tiny_kit.model_dir("llama")),
        "--dataset_name", str(weighted_json),
        "--output_dir", str(out),
        "--max_length", "64",
        *TINY_RUN, *CHECKPOINT_AT_END,
    ])  # fmt: skip
    assert (out / "model.safetensors").is_file()
    logged = [entry for entry in _logged(out) if "loss" in entry]
    assert len(logged) == 2 and all(0 <= entry["weight/min"] <= entry["weight/max"] for entry in logged)


def test_accelerate_gets_the_values_it_would_default_with_a_warning(monkeypatch, tmp_path):
    import accelerate.commands.config
    import torch

    from kinfolk.commands.launching import without_config_defaults

    monkeypatch.setattr(accelerate.commands.config, "default_config_file", str(tmp_path / "none.yaml"))
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    stated = without_config_defaults(["--num_machines=1"])
    assert stated == ["--num_machines=1", "--mixed_precision", "no", "--dynamo_backend", "no", "--num_processes", "1"]
    # with an accelerate config file (given, or the default one) its values hold: nothing is added
    assert without_config_defaults(["--config_file", "fsdp.yaml"]) == ["--config_file", "fsdp.yaml"]
    (tmp_path / "none.yaml").write_text("num_processes: 2\n")
    assert without_config_defaults([]) == []
