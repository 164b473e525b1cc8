"""The comparison's figures, and the axis limits they were drawn with (`figures.json`, so a reader or a test can
check what the axes show without reading pixels):

- `compare.png`, the answer: every chosen method's runs, retained KL (log) against the target score on one pair of
  labelled axes: each run's envelope (the drift on first reaching each score), each method's geometric mean over
  seeds at the verdict levels, the verdict levels as dashed verticals named by their share of the baseline's gain,
  and the share of that gain each method reaches as a dotted vertical in its colour;
- `curves.png`, the rate choice: per method, the target against the step (top row) and the retained KL against the
  target (bottom row), every rate's runs (the chosen rate bold, the selection level dashed), each row on shared
  axes so the methods' panels compare by eye.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kinfolk.compare.analysis import Analysis
from kinfolk.drift.levels import seeds_drift
from kinfolk.drift.matching import START_STEP, Run
from kinfolk.figures import pyplot, save_figure

COMPARE_FIGURE, CURVES_FIGURE, LIMITS_FILE = "compare.png", "curves.png", "figures.json"


def _drifted(points) -> list[tuple[float, float]]:
    """(target, drift) after the untouched start, whose drift is 0 or float noise (no log scale for either)."""
    return [(target, drift) for step, target, drift in points if step != START_STEP and drift > 0]


def _limits(axis) -> dict[str, Any]:
    return {"xlim": list(axis.get_xlim()), "ylim": list(axis.get_ylim()), "yscale": axis.get_yscale(),
            "xlabel": axis.get_xlabel(), "ylabel": axis.get_ylabel()}  # fmt: skip


def plot_compare(analysis: Analysis, path: Path, target: str) -> dict[str, Any]:
    """`compare.png` (see the module); returns its axis limits."""
    plt = pyplot()

    figure, axis = plt.subplots(figsize=(8, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    chosen = analysis.chosen_runs()
    methods = [choice.method for choice in analysis.choices]
    scale = analysis.selection
    for index, method in enumerate(methods):
        colour = colours[index % len(colours)]
        runs: list[Run] = [run for run in chosen if run.method == method]
        for run in runs:
            envelope = _drifted(run.envelope())
            if envelope:
                axis.plot(*zip(*envelope), color=colour, linewidth=0.8, alpha=0.5, marker="o", markersize=2)
        at_levels = [(level.value, seeds_drift(runs, level.value)) for level in analysis.levels]
        at_levels = [(value, drift) for value, drift in at_levels if drift]
        rate = next(choice.rate for choice in analysis.choices if choice.method == method)
        if at_levels:
            axis.plot(*zip(*at_levels), color=colour, linewidth=2.2, marker="s", label=f"{method} (lr {rate:g})")
        else:
            axis.plot([], [], color=colour, linewidth=2.2, label=f"{method} (lr {rate:g}; reaches no verdict level)")
        reached = analysis.reached.get(method)
        if reached is not None:
            axis.axvline(scale.start + reached * (scale.reference - scale.start), color=colour, linestyle=":",
                         linewidth=1.2, label=f"{method} reaches {reached:.0%} of {analysis.baseline}'s gain")  # fmt: skip
    axis.set_yscale("log")
    for level in analysis.levels:
        axis.axvline(level.value, color="grey", linestyle="--", linewidth=0.8)
        axis.annotate(f"{level.fraction:.0%}", (level.value, 1), xycoords=("data", "axes fraction"), fontsize=7,
                      xytext=(2, -10), textcoords="offset points", color="grey")  # fmt: skip
    axis.set_xlabel(f"target: {target} (higher is better)")
    axis.set_ylabel("retained KL per token (log; lower is less drift)")
    axis.set_title(f"Drift on first reaching each target, at each method's chosen rate (dashed: verdict levels as "
                   f"shares of {analysis.baseline}'s gain)", fontsize=9)  # fmt: skip
    axis.legend(fontsize=7)
    save_figure(figure, path, dpi=120)
    return _limits(axis)


def plot_curves(analysis: Analysis, path: Path) -> list[dict[str, Any]]:
    """`curves.png` (see the module); returns each panel's axis limits, row by row."""
    plt = pyplot()

    columns = len(analysis.choices)
    figure, axes = plt.subplots(2, columns, figsize=(4 * columns, 7), squeeze=False, sharex="row", sharey="row")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for column, choice in enumerate(analysis.choices):
        top, bottom = axes[0][column], axes[1][column]
        rates = list(choice.drift_by_rate)
        first_seed = min(key.seed for key in analysis.runs if key.method == choice.method)
        for key, run in analysis.runs.items():
            if key.method != choice.method:
                continue
            style = {"color": colours[rates.index(key.rate) % len(colours)],
                     "linewidth": 2 if key.learning_rate == choice.rate else 0.8}  # fmt: skip
            points = sorted(run.checkpoints)
            label = f"lr {key.rate}" if key.seed == first_seed else None
            top.plot([p[0] for p in points], [p[1] for p in points], label=label, **style)
            envelope = _drifted(run.envelope())
            if envelope:
                bottom.plot(*zip(*envelope), marker="o", markersize=2, **style)
        bottom.axvline(analysis.selection_level, linestyle="--", color="grey", linewidth=0.8)
        bottom.set_yscale("log")
        top.set_title(f"{choice.method} (chosen lr {choice.rate:g})")
        top.set_xlabel("step")
        top.set_ylabel("target score")
        bottom.set_xlabel("target score")
        bottom.set_ylabel("retained KL (log)")
        top.legend(fontsize=7)
    save_figure(figure, path, dpi=120)
    return [_limits(axis) for row in axes for axis in row]


def write_figures(analysis: Analysis, folder: Path, target: str) -> None:
    """Both figures in `folder`, and their axis limits in `figures.json`."""
    limits = {
        COMPARE_FIGURE: [plot_compare(analysis, folder / COMPARE_FIGURE, target)],
        CURVES_FIGURE: plot_curves(analysis, folder / CURVES_FIGURE),
    }
    (folder / LIMITS_FILE).write_text(json.dumps(limits, indent=2), encoding="utf-8")
