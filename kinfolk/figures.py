"""Figures on disk: matplotlib's file backend, imported only when a figure is drawn, and a figure written whole.

Every PNG kinfolk writes (the drift report, `kinfolk compare`, the weight histogram, ADAPT's routing plot, the
lab's figures) goes through `pyplot()` and `save_figure`: matplotlib (a core dependency) stays off the start-up
path of every command, the backend draws to files and never opens a window, and a reader never sees half a PNG.
`plot_families` draws several runs of one measure and their mean (the lab's families, a method's seeds).

>>> import tempfile
>>> figure, axis = pyplot().subplots()
>>> plot_families(axis, [0, 1, 2], [[1, 2, 3], [3, 4, 5]], "C0", "mean")
>>> [float(y) for y in axis.lines[-1].get_ydata()]  # the thick line: the mean of the two curves
[2.0, 3.0, 4.0]
>>> save_figure(figure, Path(tempfile.mkdtemp()) / "curves.png").read_bytes()[:4]
b'\\x89PNG'
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np

from kinfolk.atomic import atomic_file


def pyplot() -> ModuleType:
    """`matplotlib.pyplot` drawing to files (the Agg backend), imported on the first figure, not at start-up."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure, path: str | Path, dpi: int = 100) -> Path:
    """Lay out `figure`, write it to `path` atomically (format from the suffix) and close it; returns the path."""
    path = Path(path)
    figure.tight_layout()
    with atomic_file(path, mode="wb") as handle:
        figure.savefig(handle, format=path.suffix.lstrip(".") or "png", dpi=dpi)
    pyplot().close(figure)
    return path


def plot_families(axis, x, values, colour: str, label: str, geometric: bool = False, **mean_style) -> None:
    """One measure of several runs against `x` (one row of `values` per run): each run's curve thin, their mean
    thick (geometric with `geometric`, for a log axis), the mean only where every run has a value (NaN: none)."""
    x, values = np.asarray(x), np.asarray(values, dtype=float)
    for curve in values:
        axis.plot(x, curve, color=colour, linewidth=0.6, alpha=0.35)
    mean = np.exp(np.log(np.clip(values, 1e-12, None)).mean(axis=0)) if geometric else values.mean(axis=0)
    everywhere = ~np.isnan(values).any(axis=0)
    axis.plot(x[everywhere], mean[everywhere], color=colour, linewidth=2.2, label=label, **mean_style)
