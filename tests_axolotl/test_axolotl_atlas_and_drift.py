"""`adapter: atlas` and the measuring callbacks inside axolotl: one weighted ATLAS run trained by axolotl's own
`train` (config loading, data loading, trainer builder, saving), then checked against independent computations."""

from __future__ import annotations

import json

import pytest
import torch
from axolotl_helpers import alpaca_rows, config, load_config, load_data, retained_rows, write_config, write_rows
from peft import PeftModel
from transformers import AutoModelForCausalLM

from kinfolk.batches import retained_batches
from kinfolk.drift.log import read_rows, steps


@pytest.fixture(scope="module")
def atlas_run(tiny_kit, tmp_path_factory):
    """A two-step weighted ATLAS run with retained KL and the target measured at every step."""
    from axolotl.train import train

    root = tmp_path_factory.mktemp("atlas-run")
    model_dir = tiny_kit.model_dir("llama")
    data = write_rows(root / "train.jsonl", alpaca_rows([0.5, 2.0, 1.0, 3.0] * 4))
    retained = write_rows(root / "retained.jsonl", retained_rows())
    values = config(
        root,
        model_dir,
        data,
        adapter="atlas",
        learning_rate=0.05,
        kinfolk={
            "weight_column": "weight",
            "retained_dataset": str(retained),
            "atlas": {"r": 4, "layers": [1], "regions": 2, "directions": 2, "routing_temperature": 1.0},
            "retained_kl": {"every_n_steps": 1},
            "target": {"dataset": str(retained), "every_n_steps": 1},
        },
    )
    cfg = load_config(write_config(root, values))
    model, tokenizer, trainer = train(cfg=cfg, dataset_meta=load_data(cfg))
    return {"model": model, "tokenizer": tokenizer, "trainer": trainer, "base": model_dir, "out": root / "out"}


def test_the_adapter_is_atlas_with_a_fitted_atlas(atlas_run):
    saved = json.loads((atlas_run["out"] / "adapter_config.json").read_text())
    assert saved["peft_type"] == "ATLAS" and saved["num_regions"] == 2 and saved["layers_to_transform"] == [1]
    centres = [t for name, t in atlas_run["model"].state_dict().items() if "atlas_centers" in name]
    assert centres and all(t.abs().sum() > 0 and not torch.equal(t[0], t[1]) for t in centres)  # k-means ran


def test_the_saved_adapter_reloads_with_equal_logits(atlas_run):
    trained = atlas_run["model"].eval()
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(atlas_run["base"]), atlas_run["out"])
    ids = atlas_run["tokenizer"]("What is 3 + 4? 7", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        expected = trained(input_ids=ids).logits
        with trained.disable_adapter():
            frozen = trained(input_ids=ids).logits
        torch.testing.assert_close(reloaded.eval()(input_ids=ids).logits, expected, rtol=0, atol=1e-6)
    assert (expected - frozen).abs().max() > 1e-4  # training moved the adapter off the identity


def hand_retained_kl(model, rows, tokenizer) -> float:
    """KL(frozen ‖ current) per response token from full softmaxes, the frozen model being the adapter switched off."""
    total = tokens = 0.0
    with torch.no_grad():
        for batch in retained_batches(rows, tokenizer, "response", 256, 8):
            mask = batch["labels"][:, 1:] != -100
            current = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
            with model.disable_adapter():
                frozen = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
            log_p, log_q = frozen.double().log_softmax(-1), current.double().log_softmax(-1)
            total += float(((log_p.exp() * (log_p - log_q)).sum(-1) * mask).sum())
            tokens += float(mask.sum())
    return total / tokens


def test_the_logged_kl_is_the_retained_kl_of_the_trained_model(atlas_run):
    from datasets import Dataset

    trainer = atlas_run["trainer"]
    logged = [record for record in trainer.state.log_history if "retained_kl" in record]
    assert [record["step"] for record in logged] == [0, 1, 2]  # in axolotl's own records of the steps
    assert all("loss" in record for record in logged if record["step"] > 0)
    rows = Dataset.from_list(retained_rows())  # what the run measured on
    expected = hand_retained_kl(atlas_run["model"].eval(), rows, atlas_run["tokenizer"])
    assert expected > 0
    assert logged[-1]["retained_kl"] == pytest.approx(expected, rel=1e-4)
    drift = steps(read_rows(atlas_run["out"]))
    assert drift[2]["retained_kl"] == logged[-1]["retained_kl"] and drift[0]["retained_kl"] == pytest.approx(
        0, abs=1e-9
    )


def test_kinfolk_drift_reads_the_run(atlas_run, tmp_path, capsys):
    from kinfolk.commands import main

    run = str(atlas_run["out"])
    argv = ["drift", "--run", "atlas", "0", run, "--run", "again", "0", run, "--method", "atlas", "--target", "target"]
    assert main([*argv, "--out", str(tmp_path / "report")]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    drift = steps(read_rows(run))
    checkpoints = [[step, row["target"], row["retained_kl"]] for step, row in drift.items()]
    assert report["runs"][0]["checkpoints"] == checkpoints  # every step, as the run logged it
    assert (tmp_path / "report" / "report.md").exists()
