"""`average_tokens_across_devices=False` under two gloo processes: each rank divides its weighted sum by its own D,
as SFTTrainer divides by its own token count, and the weights are still honoured (identity with SFTTrainer,
doubling). See tests/weighted_sft_options_ddp_job.py and tests/test_weighted_sft_options.py."""

from pathlib import Path

import pytest
from two_process_helpers import accelerate

JOB = Path(__file__).with_name("weighted_sft_options_ddp_job.py")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("two-processes")]


def test_per_rank_token_averaging_keeps_the_weights(tmp_path):
    accelerate(JOB, "average_tokens_across_devices=False", str(tmp_path))
    assert [(tmp_path / f"rank{rank}.done").read_text() for rank in (0, 1)] == ["2", "2"]
