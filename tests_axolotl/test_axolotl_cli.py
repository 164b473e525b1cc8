"""End to end on the CPU: `axolotl train` of examples/axolotl/atlas_weighted.yaml (a tiny local model and data in
place of its Hub model and files, two steps), then `kinfolk drift` on the run it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from axolotl_helpers import alpaca_rows, retained_rows, write_rows

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "axolotl" / "atlas_weighted.yaml"


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_axolotl_train_runs_the_example_and_kinfolk_drift_reads_it(tiny_kit, tmp_path):
    (tmp_path / "data").mkdir()
    write_rows(tmp_path / "data" / "weighted.jsonl", alpaca_rows([0.5, 2.0, 1.0, 3.0] * 4))
    write_rows(tmp_path / "data" / "retained.jsonl", retained_rows())
    write_rows(tmp_path / "data" / "validation.jsonl", retained_rows(6))
    values = yaml.safe_load(EXAMPLE.read_text())
    assert values["adapter"] == "atlas" and values["kinfolk"]["weight_column"] == "weight"
    values.update(
        base_model=str(tiny_kit.model_dir("llama")),
        sequence_len=256,
        max_steps=2,
        gradient_accumulation_steps=2,
        warmup_steps=0,
        learning_rate=0.05,  # two steps that move the tiny model measurably
        logging_steps=1,
        bf16=False,
        dataset_processes=1,
        dataset_prepared_path="prepared",
    )
    values["kinfolk"]["atlas"].update(r=4, layers=[1], regions=2, directions=2)
    values["kinfolk"]["retained_kl"]["every_n_steps"] = 1
    values["kinfolk"]["target"]["every_n_steps"] = 1
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(values))

    trained = run(["axolotl", "train", "run.yaml", "--launcher", "python"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    out = tmp_path / values["output_dir"]
    assert json.loads((out / "adapter_config.json").read_text())["peft_type"] == "ATLAS"
    rows = [json.loads(line) for line in (out / "drift.jsonl").read_text().splitlines()]
    assert sorted({row["step"] for row in rows if "retained_kl" in row}) == [0, 1, 2]
    assert sorted({row["step"] for row in rows if "target" in row}) == [0, 1, 2]

    drift = [sys.executable, "-m", "kinfolk", "drift", "--method", "atlas", "--target", "target", "--out", "report"]
    read = run([*drift, "--run", "atlas", "0", str(out), "--run", "again", "0", str(out)], tmp_path)
    assert read.returncode == 0, read.stderr[-3000:]
    assert "atlas" in (tmp_path / "report" / "report.md").read_text()
