"""`kinfolk lab experiment atlas`: every family's record, the fronts' summary and figure, the run over families."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kinfolk.lab.demo.plots import plot_families, save_figure
from kinfolk.lab.methods.atlas.endpoints import declare_endpoints
from kinfolk.lab.methods.atlas.fronts import analyse_target
from kinfolk.lab.methods.atlas.runs import geometry, prepare, run_name, train_run
from kinfolk.lab.methods.atlas.settings import METHODS, PLOT_GRID, SPLITS, AtlasSettings, family_config
from kinfolk.lab.methods.replication import cached_json, run_families, settings_key
from kinfolk.lab.world.family import Family
from kinfolk.lab.world.skills import RETAINED
from kinfolk.lab.world.training import single_threaded


def atlas_family(family: Family, work: Path, settings: AtlasSettings) -> dict[str, Any]:
    """One family's record: frozen scores, the atlas geometry, every run's checkpoints and the per-target analysis.
    Each run is kept under `work` as soon as it is done, so a stopped family resumes at its next run."""
    # a run is kept under the settings that made it: a changed step count or grid must not reuse it
    work = work / f"settings-{settings_key(dataclasses.asdict(settings))}"
    with single_threaded():
        context = prepare(family, settings)
        record: dict[str, Any] = {
            "layer": context.layer,
            "frozen": {
                skill: {split: context.frozen_score(skill, split) for split in SPLITS}
                for skill in [RETAINED, *settings.targets]
            },
            "geometry": geometry(context),
            "runs": {},
        }
        for target in settings.targets:
            runs = {}
            for method in settings.methods:
                for learning_rate in settings.rates(method):
                    for strength in settings.strengths(method):
                        name = run_name(method, learning_rate, strength)
                        runs[name] = cached_json(
                            work / target / f"{name}.json",
                            lambda t=target, m=method, lr=learning_rate, s=strength: train_run(context, t, m, lr, s),
                        )
            record["runs"][target] = runs
    record["analysis"] = {target: analyse_target(record, target) for target in settings.targets}
    return record


# ------------------------------------------------------------------------------------------------ fronts and plot
def fronts_summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The test fronts of every family on a common axis (fractions of LoRA's gain, `PLOT_GRID`), for the plot."""
    fronts: dict[str, Any] = {}
    for record in records:
        for target, analysis in record["analysis"].items():
            entry = fronts.setdefault(target, {"grid": list(PLOT_GRID), "families": {}})
            entry["families"][str(record["family_seed"])] = {
                "frozen": analysis["frozen"],
                "lora_best": analysis["lora_best"],
                "selected": analysis["selected"],
                "methods": {m: e["grid"] for m, e in analysis.get("methods", {}).items()},
            }
    return {"fronts": fronts}


def plot_fronts(results: dict[str, Any], path: str | Path) -> Path:
    """Retained KL (log axis) and correct → wrong answers against the target gain, one column per target: each
    family's front as a thin line, the mean over families (geometric for KL) as a thick one where every family's
    front reaches."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fronts = results["fronts"]
    measures = {"kl": "retained KL (test)", "forgot": "correct → wrong / frozen-correct (test)"}
    figure, axes = plt.subplots(2, len(fronts), figsize=(5.5 * len(fronts), 7), squeeze=False)
    colours = dict(zip(METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 2))
    for column, (target, entry) in enumerate(fronts.items()):
        grid = np.asarray(entry["grid"])
        methods = sorted({m for family in entry["families"].values() for m in family["methods"]}, key=METHODS.index)
        for row, (measure, label) in enumerate(measures.items()):
            axis = axes[row][column]
            for method in methods:
                curves = [f["methods"][method][measure] for f in entry["families"].values() if method in f["methods"]]
                values = [[np.nan if v is None else v for v in curve] for curve in curves]
                plot_families(axis, grid, values, colours[method], method, geometric=measure == "kl")
            if measure == "kl":
                axis.set_yscale("log")
            axis.set_ylabel(label)
            axis.set_xlabel("target gain, as a fraction of LoRA's (0: frozen, 1: LoRA's best)")
            axis.set_title(f"{target} ({len(entry['families'])} families)")
    axes[0][0].legend(fontsize=7)
    return save_figure(figure, path, dpi=110)


def run_atlas(
    out: str | Path,
    families: list[int],
    settings: AtlasSettings | None = None,
    quick: bool = False,
    **options,
) -> dict[str, Any]:
    """The experiment over `families` (family seeds); `options` go to `replication.run_families`. Writes
    `results.json` (with every family's fronts) and `fronts.png` to `out`."""
    settings = settings or AtlasSettings()
    results = run_families(
        "atlas",
        out,
        families,
        lambda seed: family_config(seed, settings, quick),
        lambda family, work: atlas_family(family, work, settings),
        declare_endpoints(settings.targets, settings.methods),
        {**dataclasses.asdict(settings), "quick": quick},
        summary=fronts_summary,
        **options,
    )
    plot_fronts(results, Path(out) / "fronts.png")
    return results


if __name__ == "__main__":  # python -m kinfolk.lab.methods.atlas.experiment RESULTS.json FIGURE.png
    import json
    import sys

    plot_fronts(json.loads(Path(sys.argv[1]).read_text()), sys.argv[2])
