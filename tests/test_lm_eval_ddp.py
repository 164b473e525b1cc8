"""LmEvalCallback under two gloo processes: the main process evaluates while the other waits, each evaluation is
logged and written once, and the scores and churn equal one process's over the same training."""

from pathlib import Path

import pytest
from lm_eval_ddp_job import train
from two_process_helpers import accelerate

from kinfolk.drift.churn import read_samples
from kinfolk.drift.log import read_rows

JOB = Path(__file__).with_name("lm_eval_ddp_job.py")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("two-processes")]


def flat(value) -> list:
    if isinstance(value, (list, tuple)) or hasattr(value, "__next__"):
        return [item for part in value for item in flat(part)]
    return [value]


def test_the_main_process_evaluates_once_and_scores_as_one_process(tmp_path):
    accelerate(JOB, str(tmp_path / "two"))
    train(str(tmp_path / "one"), processes=1)
    rows = {name: [row for row in read_rows(tmp_path / name) if "lm_eval_seconds" in row] for name in ("two", "one")}
    assert [row["step"] for row in rows["two"]] == [2, 4]  # once per evaluation, not once per process
    for ours, reference in zip(rows["two"], rows["one"]):
        scores = {key: value for key, value in reference.items() if key.startswith(("lm_eval/", "churn/"))}
        assert scores and {key: ours[key] for key in scores} == scores
    for step in (2, 4):
        two, one = (
            tmp_path / name / "lm_eval" / f"step-{step}" / "samples_kinfolk_csqa_sample.jsonl"
            for name in ("two", "one")
        )
        # log-likelihoods to rounding (DDP's all-reduce and accumulation add in different orders), answers exactly
        assert flat(record["resps"] for record in read_samples(two)) == pytest.approx(
            flat(record["resps"] for record in read_samples(one)), rel=1e-4
        )
