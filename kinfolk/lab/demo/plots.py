"""Figure helpers shared by the lab's experiments and the demo's report (so neither imports the other)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_families(axis, x, values, colour: str, label: str, geometric: bool = False, **mean_style) -> None:
    """One measure of every family against `x`: each family's curve thin, their mean thick (geometric with
    `geometric`, for a log axis), the mean only where every family has a value (NaN: none)."""
    x, values = np.asarray(x), np.asarray(values, dtype=float)
    for curve in values:
        axis.plot(x, curve, color=colour, linewidth=0.6, alpha=0.35)
    mean = np.exp(np.log(np.clip(values, 1e-12, None)).mean(axis=0)) if geometric else values.mean(axis=0)
    everywhere = ~np.isnan(values).any(axis=0)
    axis.plot(x[everywhere], mean[everywhere], color=colour, linewidth=2.2, label=label, **mean_style)


def save_figure(figure, path, dpi: int = 100) -> Path:
    """Lay out, write and close a matplotlib figure; returns the path written."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
    return path
