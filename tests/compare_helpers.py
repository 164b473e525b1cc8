"""What the `kinfolk compare` tests share: data folders of tiny prompt/completion rows, and a run's curves read by
hand from its drift.jsonl with the documented reading written out (`drift_when_reached`)."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from kinfolk.testing import prompt_completion_dataset

SIZES = {"train": 32, "validation": 8, "test": 8}


def write_splits(folder: Path, seed: int, splits: Sequence[str] = ("train", "validation")) -> Path:
    """A data folder with one `<split>.jsonl` per split, each drawn with its own seed."""
    folder.mkdir(parents=True)
    for offset, split in enumerate(splits):
        prompt_completion_dataset(SIZES[split], seed=seed + offset).to_json(str(folder / f"{split}.jsonl"))
    return folder


def compare_inputs(tiny_kit, root: Path) -> dict[str, Path]:
    """A comparison's inputs: the tiny Llama, a target and a retained data folder (training and validation splits)."""
    return {
        "model": tiny_kit.model_dir("llama", "small"),
        "target": write_splits(root / "target", 0),
        "retained": write_splits(root / "retained", 100),
    }


def measurements(folder: Path) -> dict[int, dict]:
    """A run's measured values per step, the timings and checkpoint names left out (they differ between sittings)."""
    return {
        step: {name: value for name, value in row.items() if not name.endswith("seconds") and name != "checkpoint"}
        for step, row in merged_rows(folder).items()
    }


def merged_rows(folder: Path) -> dict[int, dict]:
    """drift.jsonl's rows merged per step, as written."""
    merged: dict[int, dict] = {}
    for line in (folder / "drift.jsonl").read_text().splitlines():
        row = json.loads(line)
        merged.setdefault(row["step"], {}).update(row)
    return merged


def logged_curve(folder: Path, target: str = "target", kl: str = "retained_kl") -> list[tuple[int, float, float]]:
    """(step, target, KL) at the steps carrying both keys."""
    return sorted((s, r[target], r[kl]) for s, r in merged_rows(folder).items() if target in r and kl in r)


def drift_when_reached(curve, level: float, drifts: Mapping[int, float] | None = None) -> float | None:
    """The documented reading, written out: records of the running maximum; linear from step 0, geometric after.
    With `drifts` (step -> drift on other rows) the point is found on `curve` and the drift read is theirs."""
    records = []
    for point in curve:
        if not records or point[1] > records[-1][1]:
            records.append(point)
    if drifts is not None:
        records = [(step, target, drifts[step]) for step, target, _ in records]
    if not records[0][1] <= level <= records[-1][1]:
        return None
    for (step, low, low_kl), (_, high, high_kl) in itertools.pairwise(records):
        if low < level < high:
            f = (level - low) / (high - low)
            return low_kl + f * (high_kl - low_kl) if step == 0 else low_kl ** (1 - f) * high_kl**f
    return next(kl for _, target, kl in records if target == level)


def geometric_mean(values):
    return math.exp(sum(map(math.log, values)) / len(values))
