"""The drift report of `kinfolk drift`: runs read from their `drift.jsonl` logs, compared by `kinfolk.drift`.

The comparison (each run's drift read off its running-maximum envelope of the target, interpolated, never
extrapolated; ratios over seeds with the lab protocol's t-interval) lives in `kinfolk.drift`, whose names are
re-exported here for code that imported them from this module. `load_run` reads one run's log (row format:
docs/measurement.md).

    kinfolk drift --run atlas 1 runs/atlas-s1 --run atlas 2 runs/atlas-s2 \\
        --run lora 1 runs/lora-s1 --run lora 2 runs/lora-s2 \\
        --method atlas --target lm_eval/kinfolk_mbpp_plus/pass_at_1_count --out reports/mbpp
"""

from __future__ import annotations

from pathlib import Path

from kinfolk.callbacks.drift_log import read_rows, steps
from kinfolk.drift import (
    MatchedGain,
    Run,
    markdown,
    parse_requirements,
    plot,
    shared_requirements,
    target_matched,
    write_report,
)

__all__ = [
    "MatchedGain",
    "Run",
    "load_run",
    "markdown",
    "parse_requirements",
    "plot",
    "shared_requirements",
    "target_matched",
    "write_report",
]


def load_run(method: str, seed: str, path: str | Path, target: str, kl: str = "retained_kl") -> Run:
    """Checkpoints of a run directory (or drift.jsonl file) that carry both the target and the KL."""
    return Run.from_steps(method, str(seed), str(path), steps(read_rows(path)), target, kl)
