"""`kinfolk sft`'s bad-input matrix: every case exits 2 with one line naming the data file, column, row, model,
adapter field or option, without a traceback, before training starts, and writes nothing at `--output_dir`.

`kinfolk sft` parses its options, then starts `accelerate launch` on `kinfolk.commands.sft`, whose processes run
`launched(argv)` under the command line's exit-code rule. Option errors are found by the parse (`main`, in this
process); the rest run `launched` in this process (what each launched process runs), and one real `kinfolk sft`
subprocess shows the exit code and the single line coming back through `accelerate launch`.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict
from refusal_helpers import assert_command_refused, assert_refused
from sft_helpers import config

from kinfolk.commands import main as kinfolk_main
from kinfolk.commands import run
from kinfolk.commands.sft import launched
from kinfolk.errors import DatasetFormatError, EmptyDatasetError
from kinfolk.testing import build_model, prompt_completion_dataset
from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

TINY_RUN = ["--use_cpu", "--report_to", "none", "--save_strategy", "no", "--max_steps", "1",
            "--per_device_train_batch_size", "2", "--disable_tqdm", "True"]  # fmt: skip


def weighted_rows(weights):
    return [
        {"prompt": f"{index} + 1 =", "completion": f" {index + 1}", "weight": w} for index, w in enumerate(weights)
    ]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Data files and folders, good and bad, shared by the cases (which must leave them untouched)."""
    root = tmp_path_factory.mktemp("sft-data")

    def lines(name, rows):
        (root / name).write_text("".join(json.dumps(row) + "\n" for row in rows))

    lines("train.jsonl", weighted_rows([1.0, 2.0, 0.5, 1.0]))
    lines("negative-weight.jsonl", weighted_rows([1.0, -1.0, 2.0]))
    lines("text-weight.jsonl", weighted_rows(["x", 1.0]))
    lines("zero-weights.jsonl", weighted_rows([0.0, 0.0, 0.0]))
    lines("unweighted.jsonl", [{"prompt": "1 + 1 =", "completion": " 2"}])
    lines("no-sft-columns.jsonl", [{"question": "q", "answer": "a", "weight": 1.0}])
    (root / "empty.jsonl").write_text("")
    Dataset.from_dict({"prompt": [], "completion": [], "weight": []}).save_to_disk(str(root / "empty-saved"))
    rows = Dataset.from_list(weighted_rows([1.0, 2.0]))
    DatasetDict({"validation": rows}).save_to_disk(str(root / "validation-only"))
    (root / "a-file").write_text("")
    (root / "not-a-checkpoint").mkdir()
    return root


def refused_sft(argv, *named, output_dir, inputs=()):
    """`launched(argv)` under the command line's exit-code rule, as each process of `kinfolk sft` runs it; an
    `output_dir` that already exists (as a file) is an input, not a destination."""
    return assert_command_refused(
        ["sft", *argv, "--output_dir", output_dir, *TINY_RUN],
        *named,
        destination=None if Path(output_dir).exists() else output_dir,
        inputs=inputs,
        run=lambda argv: run("kinfolk sft", lambda: launched(argv[1:])),
    )


SFT_CASES = {
    # data
    "empty data file": (["--dataset_name", "{data}/empty.jsonl"], ["empty.jsonl is empty"]),
    "missing data file": (["--dataset_name", "{data}/missing.jsonl"], ["missing.jsonl: no such data file"]),
    "empty saved dataset": (["--dataset_name", "{data}/empty-saved"], ["empty-saved holds no rows"]),
    "no train split": (["--dataset_name", "{data}/validation-only"], ["validation-only", "not 'train'"]),
    "no test split to evaluate on": (
        ["--dataset_name", "{data}/train.jsonl", "--eval_strategy", "steps", "--eval_steps", "1"],
        ["train.jsonl has splits ['train'], not 'test'"],
    ),
    "no SFT columns": (["--dataset_name", "{data}/no-sft-columns.jsonl"], ["no-sft-columns.jsonl", "'question'"]),
    # the weight column
    "no weight column": (["--dataset_name", "{data}/unweighted.jsonl"], ["unweighted.jsonl", "no weight column"]),
    "negative weight": (
        ["--dataset_name", "{data}/negative-weight.jsonl"],
        ["negative-weight.jsonl", "rows 1 (-1.0)"],
    ),
    "weight not a number": (["--dataset_name", "{data}/text-weight.jsonl"], ["text-weight.jsonl", "rows 0 ('x')"]),
    "every weight zero": (["--dataset_name", "{data}/zero-weights.jsonl"], ["zero-weights.jsonl", "every weight"]),
    # model, output and resumption
    "model missing": (["--model_name_or_path", "{data}/no-model"], ["no-model: no such directory"]),
    "checkpoint missing": (["--resume_from_checkpoint", "{data}/checkpoint-9"], ["checkpoint-9: no such checkpoint"]),
    "not a checkpoint": (["--resume_from_checkpoint", "{data}/not-a-checkpoint"], ["has no trainer_state.json"]),
    "nothing to resume": (["--resume_from_checkpoint", "true"], ["--resume_from_checkpoint true:", "no checkpoint-N"]),
    # adapters
    "ATLAS rank above the module": (
        ["--use_atlas", "--atlas_retained_dataset", "{data}/train.jsonl", "--atlas_r", "999", "--atlas_layers", "0"],
        ["model.layers.0.", "r=999 is larger than the module's widths"],
    ),
    "ATLAS rank zero": (["--use_atlas", "--atlas_r", "0"], ["r must be a positive integer, got 0"]),
    "ATLAS without retained data": (["--use_atlas"], ["--use_atlas needs retained data"]),
    "ATLAS retained data empty": (
        ["--use_atlas", "--atlas_retained_dataset", "{data}/empty.jsonl"],
        ["empty.jsonl is empty"],
    ),
    # TRL passes one --lora_target_modules value to PEFT as a regular expression over whole module names
    "LoRA target modules matching no module": (
        ["--use_peft", "--lora_target_modules", "o_proj"],
        ["--use_peft --lora_target_modules o_proj: Target modules o_proj not found", "write '.*o_proj'"],
    ),
    "ATLAS layer the model lacks": (
        ["--use_atlas", "--atlas_retained_dataset", "{data}/train.jsonl", "--atlas_layers", "9"],
        ["--use_atlas (--atlas_target_modules, --atlas_layers, --atlas_r): Target modules", "[9]"],
    ),
    "two adapters": (
        ["--use_atlas", "--use_peft", "--atlas_retained_dataset", "{data}/train.jsonl"],
        ["several adapters were requested (--use_peft, AtlasArguments)"],
    ),
    "Replay's retained data empty": (
        ["--retained_dataset_name", "{data}/empty.jsonl", "--replay_ratio", "0.5"],
        ["empty.jsonl is empty"],
    ),
}


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if a model's weights are loaded: every check that needs none must come first."""
    from transformers import PreTrainedModel

    def refuse(*args, **kwargs):
        raise AssertionError("a model's weights were loaded before the bad input was refused")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse))


@pytest.mark.parametrize("case", list(SFT_CASES))
def test_sft_refuses_bad_data_weights_models_and_adapters(tiny_kit, data, tmp_path, no_model_load, case):
    options, named = SFT_CASES[case]
    options = [option.format(data=data) for option in options]
    defaults = {"--model_name_or_path": str(tiny_kit.model_dir("llama")), "--dataset_name": str(data / "train.jsonl")}
    argv = [item for flag, value in defaults.items() if flag not in options for item in (flag, value)] + options
    refused_sft(argv, *named, output_dir=tmp_path / "run", inputs=[data])


def test_sft_refuses_to_resume_an_adapter_made_on_another_model(tiny_kit, data, tmp_path, no_model_load):
    from peft import LoraConfig, get_peft_model

    from kinfolk.testing import build_model

    checkpoint = tmp_path / "run" / "checkpoint-2"
    wider = build_model("llama", size="large")  # o_proj 64 × 64; the small Llama's is 32 × 32
    get_peft_model(wider, LoraConfig(r=4, target_modules=["o_proj"])).save_pretrained(checkpoint)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    argv = ["--model_name_or_path", tiny_kit.model_dir("llama"), "--dataset_name", data / "train.jsonl"]
    argv += ["--use_peft", "--resume_from_checkpoint", checkpoint]
    named = ["the --resume_from_checkpoint adapter", "checkpoint-2 was made for another model", "(4, 64)", "(32, 32)"]
    refused_sft(argv, *named, output_dir=tmp_path / "run", inputs=[checkpoint])


def test_sft_refuses_an_output_dir_that_is_a_file(tiny_kit, data):
    argv = ["--model_name_or_path", tiny_kit.model_dir("llama"), "--dataset_name", data / "train.jsonl"]
    refused_sft(argv, data / "a-file", "is a file", output_dir=data / "a-file", inputs=[data])


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--prompt_loss_weight", "-1"], "prompt_loss_weight=-1.0 must lie in [0, 1]"),
        (["--weight_reduction", "bogus"], "argument --weight_reduction/--weight-reduction: invalid choice: 'bogus'"),
        (["--atlas_residual", "bogus"], "--atlas_residual"),
        # a typo that neither kinfolk sft nor accelerate launch knows: one line, not accelerate's usage
        (
            ["--weight_colum", "weight"],
            "--weight_colum: unknown option, neither kinfolk sft's nor accelerate launch's;"
            " did you mean --weight_column?",
        ),
        (
            ["--num_proceses", "2"],
            "--num_proceses: unknown option, neither kinfolk sft's nor accelerate launch's; did "
            "you mean --num_processes?",
        ),
    ],
)
def test_sft_refuses_bad_options_before_launching(data, tmp_path, refuse_launch, options, named):
    out = tmp_path / "run"
    argv = [
        "sft",
        "--model_name_or_path",
        "m",
        "--dataset_name",
        data / "train.jsonl",
        "--output_dir",
        out,
        "--use_cpu",
    ]
    argv += options
    assert_command_refused(argv, named, destination=out)


@pytest.fixture
def refuse_launch(monkeypatch):
    """`accelerate launch` fails the test: what is checked must be refused before any process starts."""
    import accelerate.commands.launch

    def refuse(*args, **kwargs):
        raise AssertionError("accelerate launch started before the options were checked")

    monkeypatch.setattr(accelerate.commands.launch, "launch_command", refuse)


def test_sft_refuses_an_unknown_config_key_naming_the_file(data, tmp_path, refuse_launch):
    config = tmp_path / "run.yaml"
    config.write_text("weight_colum: weight\nnum_processes: 1\n")  # a typo beside a known accelerate key
    argv = ["sft", "--config", config, "--model_name_or_path", "m", "--dataset_name", data / "train.jsonl"]
    argv += ["--output_dir", tmp_path / "run", "--use_cpu"]
    assert_command_refused(argv, f"{config}: unknown key 'weight_colum'", destination=tmp_path / "run")


def sft_argv(tiny_kit, data, out, *options):
    return ["sft", "--model_name_or_path", tiny_kit.model_dir("llama"), "--dataset_name", data / "train.jsonl",
            "--output_dir", out, *TINY_RUN, *options]  # fmt: skip


def test_sft_refuses_an_output_dir_holding_a_run_unless_resuming_or_overwrite(tiny_kit, data, tmp_path, monkeypatch):
    import accelerate.commands.launch

    out = tmp_path / "run"
    (out / "checkpoint-4").mkdir(parents=True)
    (out / "checkpoint-4" / "trainer_state.json").write_text("{}")
    launched = []
    monkeypatch.setattr(accelerate.commands.launch, "launch_command", lambda args: launched.append(out.exists()))
    assert_command_refused(sft_argv(tiny_kit, data, out), f"--output_dir {out} already holds a run", "--overwrite")
    assert (out / "checkpoint-4").is_dir() and launched == []
    resume = ["--resume_from_checkpoint", out / "checkpoint-4"]
    assert kinfolk_main([str(a) for a in sft_argv(tiny_kit, data, out, *resume)]) == 0
    assert launched == [True] and (out / "checkpoint-4").is_dir()  # resuming continues the run in place
    assert kinfolk_main([str(a) for a in sft_argv(tiny_kit, data, out, "--overwrite")]) == 0
    assert launched == [True, False]  # --overwrite removed the old run before launching


@pytest.mark.slow
def test_kinfolk_sft_twice_into_one_output_dir_is_refused_the_second_time(tiny_kit, data, tmp_path):
    """The second `kinfolk sft` is a process of its own, refused before it launches anything; the first run and the
    resume run what each launched process runs (`kinfolk.commands.sft.train`), in this process."""
    from kinfolk.commands import sft as sft_cli

    out = tmp_path / "run"
    argv = [*map(str, sft_argv(tiny_kit, data, out)), "--save_strategy", "steps", "--save_steps", "1"]
    sft_cli.train(*sft_cli.make_parser().parse_args_and_config(argv[1:]))
    assert sorted(path.name for path in out.glob("checkpoint-*")) == ["checkpoint-1"]
    second = subprocess.run([str(Path(sys.executable).with_name("kinfolk")), *argv], capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert second.returncode == 2, second.stderr[-3000:]
    errors = [line for line in second.stderr.splitlines() if line.startswith("kinfolk sft: error:")]
    assert errors == [
        f"kinfolk sft: error: --output_dir {out} already holds a run; pass --overwrite to replace it or "
        "--resume_from_checkpoint to continue it"
    ], second.stderr[-3000:]
    resume = [*argv[1:], "--resume_from_checkpoint", "true", "--max_steps", "2"]  # "true": the last checkpoint
    sft_cli.train(*sft_cli.make_parser().parse_args_and_config(resume))
    assert sorted(path.name for path in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]


@pytest.mark.slow
def test_kinfolk_sft_exits_2_with_one_line_through_accelerate_launch(tiny_kit, data, tmp_path):
    out = tmp_path / "run"
    command = [str(Path(sys.executable).with_name("kinfolk")), "sft", "--num_processes", "1"]
    command += ["--model_name_or_path", str(tiny_kit.model_dir("llama")), "--dataset_name", str(data / "empty.jsonl")]
    command += ["--output_dir", str(out), *TINY_RUN]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 2, finished.stderr[-3000:]
    assert "Traceback" not in finished.stderr, finished.stderr[-3000:]
    errors = [line for line in finished.stderr.splitlines() if line.startswith("kinfolk sft: error:")]
    assert errors == [f"kinfolk sft: error: {data / 'empty.jsonl'} is empty"], finished.stderr[-3000:]
    assert not out.exists()


# --- the trainer itself (the API) ----------------------------------------------------------------------------------


@pytest.mark.parametrize("split", ["train", "eval"])
def test_weighted_sft_trainer_refuses_an_empty_dataset_before_trl_reads_its_first_row(tiny_tokenizer, tmp_path, split):
    rows = prompt_completion_dataset(4).add_column("weight", [1.0] * 4)
    empty = rows.select([])
    datasets = {
        "train_dataset": empty if split == "train" else rows,
        "eval_dataset": empty if split == "eval" else None,
    }
    assert_refused(
        lambda: WeightedSFTTrainer(
            model=build_model("llama", tokenizer=tiny_tokenizer),
            args=config(WeightedSFTConfig, tmp_path / "run"),
            processing_class=tiny_tokenizer,
            **datasets,
        ),
        EmptyDatasetError,
        f"the {split} dataset has no rows",
        "'completion', 'prompt', 'weight'",
        destination=tmp_path / "run",
    )


def test_weighted_sft_trainer_refuses_data_without_sft_columns(tiny_tokenizer, tmp_path):
    rows = Dataset.from_dict({"question": ["q"], "answer": ["a"], "weight": [1.0]})
    assert_refused(
        lambda: WeightedSFTTrainer(
            model=build_model("llama", tokenizer=tiny_tokenizer),
            args=config(WeightedSFTConfig, tmp_path / "run"),
            train_dataset=rows,
            processing_class=tiny_tokenizer,
        ),
        DatasetFormatError,
        "the train dataset",
        "columns present: ['answer', 'question', 'weight']",
        destination=tmp_path / "run",
    )
