"""RetainedKLCallback under two CPU processes: the shards, padded to equal length, pool into the one-process KL."""

import sys
from pathlib import Path

import pytest
from peft import PeftModel
from retained_kl_helpers import reference_retained_kl, reference_target
from two_process_helpers import accelerate

from kinfolk.drift.log import read_rows, steps
from kinfolk.testing import build_model, perturbed_copy
from kinfolk.tokens import sft_tokenize

DDP_JOB = Path(__file__).with_name("retained_kl_ddp_job.py")


CACHES = ["auto", "hidden", "auto@1"]  # auto@1: LoRA on layer 1 only, measured from it
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("two-processes")]  # one 2-process job at a time


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    """One launch trains once per cache (each launch starts two interpreters with the whole stack)."""
    root = tmp_path_factory.mktemp("retained-kl-ddp")
    accelerate(DDP_JOB, str(root), *CACHES)
    return {cache: root / cache for cache in CACHES}


@pytest.mark.parametrize("cache", CACHES)
def test_two_processes_log_the_kl_of_the_whole_retained_set(run_dirs, tiny_tokenizer, cache):
    run_dir = run_dirs[cache]
    sys.path.insert(0, str(DDP_JOB.parent))
    from retained_kl_ddp_job import retained_data

    assert (run_dir / "num_processes").read_text() == "2"
    base = build_model("llama", tokenizer=tiny_tokenizer)
    frozen = perturbed_copy(base, scale=0.0)
    trained = PeftModel.from_pretrained(base, run_dir / "adapter")
    retained = retained_data()
    rows = steps(read_rows(run_dir))
    assert sorted(rows) == [0, 1, 2]
    assert rows[0]["retained_kl"] == pytest.approx(0.0, abs=1e-7)
    expected = reference_retained_kl(frozen, trained, tiny_tokenizer, retained)
    assert expected > 1e-4
    assert rows[2]["retained_kl"] == pytest.approx(expected, rel=1e-4)
    # the weight-0 repeat that keeps the ranks in step adds no tokens
    labels = sft_tokenize(retained, tiny_tokenizer)["labels"]
    assert rows[2]["retained_kl_tokens"] == sum(sum(label != -100 for label in row[1:]) for row in labels)
    assert rows[2]["retained_kl_contexts"] == len(labels)
    assert rows[2]["from_layer"] == (1 if cache == "auto@1" else None)
    # TargetMetricCallback: every process measures all rows; the logged score is the one-process one
    assert rows[2]["target"] == pytest.approx(reference_target(trained, tiny_tokenizer, retained), rel=1e-5)
