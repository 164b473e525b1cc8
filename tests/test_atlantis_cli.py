"""`kinfolk score`: output layout, atomic writes, re-weighting without models, and 1 vs 2 processes."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset, load_from_disk
from two_process_helpers import accelerate_flags, run

import kinfolk.plugins.atlantis.diagnostics
from kinfolk.commands import main
from kinfolk.plugins.atlantis import compute_weights, score_dataset
from kinfolk.testing import prompt_completion_dataset


@pytest.fixture()
def setup(tiny_kit, tmp_path):
    family = tiny_kit.family("llama")
    data = tmp_path / "train.jsonl"
    prompt_completion_dataset(16, seed=2).to_json(str(data))
    models = [
        "--large-base", str(family["large_base"]),
        "--small-base", str(family["small_base"]),
        "--reference", str(family["small_instruct"]),
    ]  # fmt: skip
    return {"family": family, "data": data, "models": models, "cache": ["--cache_dir", str(tmp_path / "cache")]}


def leftovers(directory: Path) -> list[str]:
    return [path.name for path in directory.iterdir() if path.name.startswith(".")]


def test_score_writes_the_scored_dataset_and_its_report(setup, tmp_path, capsys):
    out = tmp_path / "scored"
    argv = ["score", "--data", str(setup["data"]), *setup["models"], "--out", str(out), *setup["cache"]]
    assert main(argv) == 0
    assert "ESS / N" in capsys.readouterr().out
    scored = load_from_disk(str(out))
    family = setup["family"]
    expected = score_dataset(
        prompt_completion_dataset(16, seed=2),
        large_base=family["large_base"],
        small_base=family["small_base"],
        reference=family["small_instruct"],
        cache_dir=str(tmp_path / "cache"),
    )
    assert scored.column_names == expected.column_names
    for column in ("large_base_logprob", "small_base_logprob", "reference_logprob", "weight"):
        np.testing.assert_allclose(scored[column], expected[column], rtol=1e-12)
    report = json.loads((out / "weights_report.json").read_text())
    assert report["n"] == 16 and report["config"]["formula"] == "ratio"

    assert main(argv) == 2  # refuses to overwrite: bad input, one line
    assert "--overwrite" in capsys.readouterr().err
    assert main([*argv, "--overwrite", "--formula", "influence"]) == 0
    assert load_from_disk(str(out))["weight"] != scored["weight"]
    assert leftovers(tmp_path) == []


def test_reweighting_a_scored_dataset_needs_no_model(setup, tmp_path):
    out = tmp_path / "scored"
    assert main(["score", "--data", str(setup["data"]), *setup["models"], "--out", str(out), *setup["cache"]]) == 0
    config = tmp_path / "score.yaml"
    config.write_text("formula: algorithm1\nnormalization: token\ntemperature: 2.0\n")
    again = tmp_path / "again"
    assert main(["score", "--data", str(out), "--out", str(again), "--config", str(config)]) == 0
    expected = compute_weights(load_from_disk(str(out)), formula="algorithm1", normalization="token", temperature=2.0)
    np.testing.assert_allclose(load_from_disk(str(again))["weight"], expected["weight"], rtol=1e-12)


def test_select_fraction_when_reweighting_selects_by_the_files_ifd_or_is_refused(setup, tmp_path, capsys):
    scored = tmp_path / "scored"
    assert main(["score", "--data", str(setup["data"]), *setup["models"], "--out", str(scored), *setup["cache"]]) == 0
    refused = tmp_path / "refused.jsonl"
    capsys.readouterr()
    assert main(["score", "--data", str(scored), "--out", str(refused), "--select_fraction", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{scored}: --select_fraction 0.5 needs each row's IFD" in err
    assert "no 'ifd' column" in err and "--small_base MODEL" in err and not refused.exists()

    selected = tmp_path / "selected"
    argv = ["score", "--data", str(setup["data"]), *setup["models"], "--out", str(selected), *setup["cache"]]
    assert main([*argv, "--select_fraction", "0.75"]) == 0
    ifd = np.asarray(load_from_disk(str(selected))["ifd"])
    half = tmp_path / "half.jsonl"
    assert main(["score", "--data", str(selected), "--out", str(half), "--select_fraction", "0.5"]) == 0
    kept = Dataset.from_json(str(half))
    assert len(kept) == int(np.ceil(0.5 * len(ifd)))  # the top half by the file's own IFD column
    np.testing.assert_allclose(sorted(kept["ifd"], reverse=True), sorted(ifd, reverse=True)[: len(kept)], rtol=1e-12)
    np.testing.assert_allclose(kept["weight"], compute_weights(kept)["weight"], rtol=1e-12)  # re-weighted


def test_a_failed_run_leaves_no_output(setup, tmp_path, monkeypatch, capsys):
    rows = prompt_completion_dataset(4).to_list()
    rows[2]["completion"] = ""
    bad = tmp_path / "bad.jsonl"
    Dataset.from_list(rows).to_json(str(bad))
    out = tmp_path / "out"
    assert main(["score", "--data", str(bad), *setup["models"], "--out", str(out), *setup["cache"]]) == 2
    assert "rows [2] have an empty response" in capsys.readouterr().err
    assert not out.exists()

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    # fails half-way through writing --out (`kinfolk score` imports the writer when it runs)
    monkeypatch.setattr(kinfolk.plugins.atlantis.diagnostics, "write_report", disk_full)
    capsys.readouterr()
    assert main(["score", "--data", str(setup["data"]), *setup["models"], "--out", str(out), *setup["cache"]]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]  # one line naming --out (kinfolk.diskspace)
    assert error.startswith(f"kinfolk score: error: no space left on device while writing {out} ")
    assert not out.exists() and leftovers(tmp_path) == []


def test_no_models_and_no_scores_is_explained(setup, tmp_path, capsys):
    assert main(["score", "--data", str(setup["data"]), "--out", str(tmp_path / "o")]) == 2
    assert "holds no scores" in capsys.readouterr().err


@pytest.mark.slow
def test_two_processes_give_the_same_columns_as_one(setup, tmp_path):
    common = ["--data", str(setup["data"]), *setup["models"], "--chunk_rows", "3", "--tokens_per_batch", "64"]
    one = tmp_path / "one"
    assert main(["score", *common, "--out", str(one), "--cache_dir", str(tmp_path / "cache-1")]) == 0
    two = tmp_path / "two"
    # on a CPU-only host accelerate's `--cpu` launches a single process; `--multi_gpu` starts two, joined by gloo
    launcher = [sys.executable, "-m", "accelerate.commands.launch", *accelerate_flags()]
    launcher += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "kinfolk"]
    run([*launcher, "score", *common, "--out", str(two), "--cache_dir", str(tmp_path / "cache-2")])
    single, double = load_from_disk(str(one)), load_from_disk(str(two))
    assert single.column_names == double.column_names
    for column in single.column_names:
        assert single[column] == double[column], column
    writers = {int(np.load(chunk)["process"]) for chunk in (tmp_path / "cache-2").rglob("chunk-*.npz")}
    assert writers == {0, 1}  # both processes scored their share
