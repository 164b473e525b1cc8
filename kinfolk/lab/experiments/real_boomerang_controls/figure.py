"""Real-boomerang version 2's curves: each arm's every-seed curves thin and their mean thick, one column per patch
order."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kinfolk.lab.methods.adapt.size_curves_figure import plot_size_curves


def plot_curves(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    arms = [(arm, f"{arm} ({len(records)} seeds)") for arm in records[0]["test"]]
    return plot_size_curves(records, path, arms)
