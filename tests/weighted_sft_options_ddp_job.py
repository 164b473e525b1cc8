"""The option table's identity and doubling checks under two processes; run by tests/test_weighted_sft_options_ddp.py.

    python -m accelerate.commands.launch --multi_gpu --num_processes 2 weighted_sft_options_ddp_job.py OPTION RUN_DIR

Every rank runs the checks (they fail the job on a mismatch) and writes RUN_DIR/rank{R}.done with the world size.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from weighted_sft_options_helpers import BY_NAME, assert_identity_and_doubling

from kinfolk.process_group import end_process_group
from kinfolk.testing import build_tokenizer

if __name__ == "__main__":
    name, run_dir = sys.argv[1:3]
    assert_identity_and_doubling(build_tokenizer(), Path(run_dir), BY_NAME[name], processes=2)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    Path(run_dir, f"rank{rank}.done").write_text(str(world))
    end_process_group()  # every rank waits, then the trainer's group is destroyed (kinfolk.process_group)
