"""Curves of patched sizes: log perplexity and KL to the teacher against depth, one column per patch order, one
colour per arm (every seed's curve thin, their mean thick)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kinfolk.figures import plot_families, pyplot, save_figure
from kinfolk.lab.methods.adapt.size_curves import ORDERS, size_value

KL_AXIS_FLOOR = 1e-2
MEASURES = (("nll", "log perplexity (mean over sources)", False), ("kl", "KL(teacher || size), nats/token", True))


def plot_size_curves(records: Sequence[dict[str, Any]], path: str | Path, arms: Sequence[tuple[str, str]]) -> Path:
    """Every record's `test` curves of each (arm, legend) in `arms`, drawn into the PNG at `path`."""
    figure, axes = pyplot().subplots(len(MEASURES), len(ORDERS), figsize=(9, 6.5), squeeze=False)
    for column, order in enumerate(ORDERS):
        depths = [point["depth"] for point in records[0]["test"][arms[0][0]][order]]
        for row, (measure, axis_label, geometric) in enumerate(MEASURES):
            axis = axes[row][column]
            sizes = slice(None, -1) if geometric else slice(None)  # the teacher's KL is 0: off a log axis
            for index, (arm, legend) in enumerate(arms):
                values = [[size_value(p, measure) for p in r["test"][arm][order]][sizes] for r in records]
                plot_families(axis, depths[sizes], values, f"C{index}", legend, geometric)
            if geometric:  # sizes whose every block is the teacher's have KL 0 (float noise): below the axis
                axis.set_yscale("log")
                axis.set_ylim(bottom=KL_AXIS_FLOOR)
            axis.set_xlabel(f"depth (layers), patched {order}", fontsize=8)
            axis.set_ylabel(axis_label, fontsize=8)
            axis.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    return save_figure(figure, path)
