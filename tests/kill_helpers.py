"""Shared by the crash-safety tests (SIGKILL: tests/test_kill_and_resume.py; SIGTERM/SIGINT: tests/test_interrupts.py):
the job script they run in a subprocess, its environment, and what a killed writer leaves behind.

Their set-ups (`patch_setup`, `score_setup`) are session fixtures in conftest.py, built once for both files.
"""

from __future__ import annotations

import os
from pathlib import Path

from refusal_helpers import snapshot

from kinfolk.atomic import staging_owner

JOBS = Path(__file__).with_name("kill_jobs.py")
ENVIRONMENT = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": ""}


def staging_left(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if staging_owner(path) is not None)


def assert_same_files(left: Path, right: Path) -> None:
    assert {Path(p).relative_to(left) for p in snapshot([left])} == {
        Path(p).relative_to(right) for p in snapshot([right])
    }
    for path in left.rglob("*"):
        if path.is_file():
            assert path.read_bytes() == (right / path.relative_to(left)).read_bytes(), path
