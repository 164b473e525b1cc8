"""The real-boomerang curves: every seed's distilled curve thin and their mean thick, beside the undistilled curve
(the same for every seed), one column per patch order."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kinfolk.lab.methods.adapt.size_curves_figure import plot_size_curves


def plot_curves(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    arms = [("distilled", f"distilled ({len(records)} seeds)"), ("undistilled", "undistilled (one curve)")]
    return plot_size_curves(records, path, arms)
