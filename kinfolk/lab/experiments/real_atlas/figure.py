"""The real-atlas curves: every method's retained drift against its code gain on test, checkpoint by checkpoint,
one thin line per seed, with the levels of the seed's validation choice marked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kinfolk.figures import pyplot, save_figure
from kinfolk.lab.methods.selection import drift


def plot_curves(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Drift (geometric mean of the retained sources' KL, log axis) against the test code gain, every method's run
    in every seed; the untrained step 0 (gain 0, drift at the floor) is left out of the log axis."""
    plt = pyplot()

    methods = list(records[0]["runs"])
    colours = dict(zip(methods, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for index, record in enumerate(records):
        for method in methods:
            points = [p for p in record["runs"][method]["points"] if p["step"] > 0]
            axis.plot([p["test"]["gain"] for p in points], [drift(p["test"]) for p in points], marker=".",
                      color=colours[method], alpha=0.6, linewidth=1, label=method if index == 0 else None)  # fmt: skip
    axis.set_yscale("log")
    axis.set_xlabel("code gain on test (held-out NLL per token, frozen minus adapted)")
    axis.set_ylabel("retained drift on test (geometric-mean KL per token)")
    axis.set_title(f"{records[0]['model']}: every checkpoint of every method, {len(records)} seeds")
    axis.legend(fontsize=8)
    return save_figure(figure, path, dpi=110)
