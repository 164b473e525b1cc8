"""`kinfolk score --out` writes .jsonl, .parquet or a `save_to_disk` folder, and what it writes is what the TRL-style
training scripts read: `examples/sft_weighted.py` (TRL's sft script with WeightedSFTTrainer) trains on each."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kinfolk.commands import main
from kinfolk.data import load_data
from kinfolk.plugins.atlantis import compute_weights
from kinfolk.testing import prompt_completion_dataset

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = ["scored.jsonl", "scored.parquet", "scored"]


@pytest.fixture
def scores(tmp_path) -> Path:
    """Rows carrying the three models' scores, so `kinfolk score` only recomputes weights (no model needed)."""
    rows = prompt_completion_dataset(8, seed=4)
    rng = np.random.default_rng(0)
    for role in ("large_base", "small_base", "reference"):
        rows = rows.add_column(f"{role}_logprob", (-rng.uniform(5, 30, len(rows))).tolist())
    rows = rows.add_column("response_bytes", [len(text.encode()) for text in rows["completion"]])
    path = tmp_path / "scores.jsonl"
    rows.to_json(path)
    return path


@pytest.mark.parametrize("name", OUTPUTS)
def test_score_writes_the_format_its_out_names(scores, tmp_path, name):
    out = tmp_path / name
    assert main(["score", "--data", str(scores), "--out", str(out), "--formula", "influence"]) == 0
    written = load_data(out)
    expected = compute_weights(load_data(scores), formula="influence")
    np.testing.assert_allclose(written["weight"], expected["weight"], rtol=1e-12)
    assert written.column_names == expected.column_names
    report = out / "weights_report.json" if out.is_dir() else out.with_name(f"{out.stem}.weights_report.json")
    assert json.loads(report.read_text())["n"] == 8
    assert out.is_dir() == (name == "scored")


def test_score_refuses_an_output_format_it_cannot_write(scores, tmp_path, capsys):
    assert main(["score", "--data", str(scores), "--out", str(tmp_path / "scored.csv")]) == 2
    assert "scored.csv" in capsys.readouterr().err and not (tmp_path / "scored.csv").exists()


@pytest.mark.parametrize("name", OUTPUTS)
def test_the_weighted_sft_example_trains_on_scored_output(scores, tiny_kit, tmp_path, name):
    out = tmp_path / name
    assert main(["score", "--data", str(scores), "--out", str(out)]) == 0
    run = tmp_path / "run"
    command = [
        sys.executable, str(ROOT / "examples" / "sft_weighted.py"),
        "--model_name_or_path", str(tiny_kit.model_dir("llama")),
        "--dataset_name", str(out),
        "--output_dir", str(run),
        "--use_cpu", "--bf16", "False", "--report_to", "none", "--save_strategy", "no",
        "--max_steps", "1", "--per_device_train_batch_size", "2", "--logging_steps", "1", "--disable_tqdm", "True",
    ]  # fmt: skip
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert (run / "model.safetensors").is_file()
    assert "weight/mean" in finished.stdout + finished.stderr


@pytest.mark.parametrize("name", OUTPUTS)
def test_kinfolk_sft_reads_scored_output(scores, tmp_path, name):
    from kinfolk.commands import sft

    out = tmp_path / name
    assert main(["score", "--data", str(scores), "--out", str(out)]) == 0
    script_args, _, _, dataset_args, *_ = sft.make_parser().parse_args_and_config(
        ["--dataset_name", str(out), "--output_dir", str(tmp_path / "run"), "--use_cpu"]
    )
    train = sft.load_datasets(script_args, dataset_args)["train"]
    np.testing.assert_allclose(train["weight"], load_data(out)["weight"], rtol=1e-12)
