"""`drift.jsonl`: one JSON object per line in a run's output directory, appended by kinfolk's callbacks, and a
run's (target, drift) curve read from it (`load_run`).

Rows carry `step` and one of: retained-KL measurements (`retained_kl`, ...), lm-eval scores
(`lm_eval/<task>/<metric>`), churn (`churn/<task>/...`), or a checkpoint event (`checkpoint`); docs/measurement.md
lists the keys. `kinfolk drift` joins them by step. Only the main process writes; a resumed run may append a step again and the later row wins.

>>> import tempfile
>>> run = tempfile.mkdtemp()
>>> _ = append_row(run, {"step": 10, "retained_kl": 0.01})
>>> _ = append_row(run, {"step": 10, "checkpoint": "checkpoint-10"})
>>> steps(read_rows(run))
{10: {'step': 10, 'retained_kl': 0.01, 'checkpoint': 'checkpoint-10'}}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kinfolk.drift.matching import Run
from kinfolk.inputs import read_json_lines

DRIFT_FILE = "drift.jsonl"


def drift_path(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    return run_dir if run_dir.suffix == ".jsonl" else run_dir / DRIFT_FILE


def append_row(run_dir: str | Path, row: dict[str, Any]) -> Path:
    """Append one row as a single write and fsync it, so a crash never leaves half a line behind."""
    path = drift_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row, sort_keys=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return path


def read_rows(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's drift log; a missing file, or a line that is not a JSON object with an integer `step`,
    is refused naming the file and line."""
    return read_json_lines(
        drift_path(run_dir),
        f"drift log (a run directory holds {DRIFT_FILE})",
        lambda row: isinstance(row, dict) and type(row.get("step")) is int,  # bool is not a step
        "a drift row (an object with an integer 'step')",
    )


def steps(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Rows merged per step, later values overriding earlier ones."""
    merged: dict[int, dict[str, Any]] = {}
    for row in rows:
        merged.setdefault(row["step"], {}).update(row)
    return dict(sorted(merged.items()))


def load_run(method: str, seed: str, path: str | Path, target: str, kl: str = "retained_kl") -> Run:
    """Checkpoints of a run directory (or drift.jsonl file) that carry both the target and the KL."""
    return Run.from_steps(method, str(seed), str(path), steps(read_rows(path)), target, kl)
