"""DeepSpeed ZeRO-3 on two CPU processes (DeepSpeed's CPU accelerator over gloo): RetainedKLCallback and
TargetMetricCallback measure a model whose every parameter is partitioned, and log the KL and the score recomputed in
one process from the saved weights.

The GPU checks (tests/gpu) found the head read outside the model's forward failing under ZeRO-3 ("current head has
0 rows"); measurements now gather it for the read (`kinfolk.sharding.gathered_for_reading`).
"""

import json
from pathlib import Path

import pytest
from peft import PeftModel
from retained_kl_ddp_job import retained_data
from retained_kl_helpers import reference_retained_kl, reference_target
from transformers import AutoModelForCausalLM
from two_process_helpers import torchrun

from kinfolk.drift.log import read_rows, steps
from kinfolk.testing import build_model

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("two-processes")]  # one 2-process job at a time

JOB = Path(__file__).with_name("zero3_job.py")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_tokenizer):
    """The base saved once, then one launch that trains and measures both runs under ZeRO-3."""
    root = tmp_path_factory.mktemp("zero3")
    build_model("llama", tokenizer=tiny_tokenizer).save_pretrained(root / "base")
    tiny_tokenizer.save_pretrained(root / "base")
    torchrun(JOB, str(root), variables={"DS_ACCELERATOR": "cpu"})  # DeepSpeed's CPU accelerator: no GPU here
    return root


@pytest.mark.parametrize("run", ["full", "lora"])
def test_retained_kl_under_zero3_is_the_kl_of_the_saved_weights(run_dir, tiny_tokenizer, run):
    assert json.loads((run_dir / run / "sharding.json").read_text()) == {"zero_stage": 3, "partitioned": True}
    base = AutoModelForCausalLM.from_pretrained(run_dir / "base")
    if run == "full":
        trained = AutoModelForCausalLM.from_pretrained(run_dir / run / "saved")
    else:
        trained = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(run_dir / "base"), run_dir / run / "saved"
        )
    rows = steps(read_rows(run_dir / run))
    assert sorted(rows) == [0, 1, 2]
    assert rows[0]["retained_kl"] == pytest.approx(0.0, abs=1e-7)
    expected = reference_retained_kl(base, trained, tiny_tokenizer, retained_data())
    assert expected > 1e-3
    assert rows[2]["retained_kl"] == pytest.approx(expected, rel=1e-4)
    # TargetMetricCallback: every process measures all rows; the logged score is the one-process one
    assert rows[2]["target"] == pytest.approx(reference_target(trained, tiny_tokenizer, retained_data()), rel=1e-5)
