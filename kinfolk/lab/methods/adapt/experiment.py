"""`kinfolk lab experiment adapt`: the curves' summary and figure, and the run over families."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from kinfolk.lab.demo.plots import plot_families, save_figure
from kinfolk.lab.methods.adapt.endpoints import declare_endpoints
from kinfolk.lab.methods.adapt.family_runs import adapt_family
from kinfolk.lab.methods.adapt.settings import AdaptSettings, adapt_family_config
from kinfolk.lab.methods.replication import run_families

# ------------------------------------------------------------------------------------------------ curves and plot
_CURVE_READS = {"layers": lambda s: s["layers"], "accuracy": lambda s: s["test"]["mean"], "kl": lambda s: s["kl"]}


def curves_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Every family's curves (test accuracy and KL to the variant per size k, the sizes' layer counts): per variant,
    the interpolation stage's per budget and the transfer stage's per method, for the plot."""

    def curve(entry: dict[str, Any]) -> dict[str, list[float]]:
        sizes = entry["chosen"]
        return {key: [read(size) for size in sizes] for key, read in _CURVE_READS.items()}

    curves: dict[str, Any] = {"interpolation": {}, "transfer": {}}
    for record in records:
        family = str(record["family_seed"])
        for variant, budgets in record.get("interpolation", {}).items():
            for budget, entry in budgets.items():
                curves["interpolation"].setdefault(variant, {}).setdefault(budget, {})[family] = curve(entry)
        for variant, stage in record.get("transfer", {}).items():
            for method, entry in stage["curves"].items():
                curves["transfer"].setdefault(variant, {}).setdefault(method, {})[family] = curve(entry)
    return {"curves": curves}


def plot_curves(results: dict[str, Any], path: str | Path) -> Path:
    """Test accuracy and KL(variant ‖ model) (log axis) against the size k, one row per variant and stage
    (interpolation: a line per budget; transfer: a line per method): each family a thin line, the mean over
    families (geometric for KL) a thick one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(stage, variant, lines) for stage in ("interpolation", "transfer")
              for variant, lines in results["curves"][stage].items()]  # fmt: skip
    figure, axes = plt.subplots(len(panels), 2, figsize=(11, 3.4 * len(panels)), squeeze=False)
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, (stage, variant, lines) in enumerate(panels):
        for column, measure in enumerate(("accuracy", "kl")):
            axis = axes[row][column]
            for colour, (line, families) in zip(palette, lines.items()):
                values = np.asarray([family[measure] for family in families.values()], dtype=float)
                if measure == "kl":  # k = M is the variant itself: KL 0, nothing to draw on a log axis
                    values = np.clip(values[:, :-1], 1e-6, None)
                label = f"{line} steps" if stage == "interpolation" else line
                sizes = np.arange(values.shape[1])
                plot_families(axis, sizes, values, colour, label, geometric=measure == "kl", marker="o", markersize=3)
                axis.set_xticks(sizes)
            if measure == "kl":
                axis.set_yscale("log")
            axis.set_xlabel("size k (blocks patched back: 0 the student ... M the variant)")
            axis.set_ylabel("test accuracy" if measure == "accuracy" else "KL(variant ‖ model), k < M")
            axis.set_title(f"{stage}: {variant} ({len(next(iter(lines.values())))} families)")
            axis.legend(fontsize=7)
    return save_figure(figure, path)


def run_adapt(
    out: str | Path,
    families: list[int],
    settings: AdaptSettings | None = None,
    quick: bool = False,
    family_overrides: dict[str, Any] | None = None,
    **options,
) -> dict[str, Any]:
    """The experiment over `families` (family seeds; `family_overrides` go to `adapt_family_config`); `options` go
    to `replication.run_families`. Writes `results.json` (with every family's curves) and `curves.png` to `out`."""
    settings = settings or AdaptSettings()
    results = run_families(
        "adapt",
        out,
        families,
        lambda seed: adapt_family_config(seed, quick, **(family_overrides or {})),
        lambda family, work: adapt_family(family, work, settings, progress=options.get("progress", True)),
        declare_endpoints(settings),
        {**dataclasses.asdict(settings), "quick": quick, "family_overrides": family_overrides or {}},
        summary=curves_summary,
        **options,
    )
    if results["curves"]["interpolation"] or results["curves"]["transfer"]:
        plot_curves(results, Path(out) / "curves.png")
    return results


if __name__ == "__main__":  # python -m kinfolk.lab.methods.adapt.experiment RESULTS.json FIGURE.png
    import sys

    plot_curves(json.loads(Path(sys.argv[1]).read_text()), sys.argv[2])
