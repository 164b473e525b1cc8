"""Uniform SFT's learning-rate grid, extended one step below the edge its selection chose (exploratory).

In the atlas-controls results uniform SFT chose the lowest rate of its grid, 3e-4, on the `pr` pools in 19 of 20
runs, so the protocol's rule (extend an edge by one grid step) asks for 1e-4. That was seen after the results, so
this is not part of the plan: `extend(settings)` trains uniform at `EXTRA_RATE` on both `pr` cells of every family
and run (kept beside the plan's runs), re-selects uniform's rate on validation over the extended grid and reports
ratio minus that uniform, per unit, in `docs/results/atlantis-controls-families/uniform-extension.json`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kinfolk.lab.experiments.atlantis_controls.runs import RECORD_VERSION, AtlantisControlsRuns, grid_key
from kinfolk.lab.experiments.atlantis_controls.settings import Cell, ControlsSettings
from kinfolk.lab.protocol.family_runs import record_key
from kinfolk.lab.protocol.records import kept_record

EXTRA_RATE = 1e-4
CELLS = ("strong/pr", "weak/pr")


def chosen_test(grid: dict[str, Any], values: list[float]) -> tuple[float, float]:
    """(value, test accuracy) of the first value of the ascending grid with the best validation accuracy."""
    best = max(sorted(values), key=lambda v: (grid[grid_key(v)]["validation"]["mean"], -sorted(values).index(v)))
    return best, grid[grid_key(best)]["test"]["mean"]


def extend(settings: ControlsSettings) -> dict[str, Any]:
    runs = AtlantisControlsRuns(settings)
    rates = [EXTRA_RATE, *settings.learning_rates]
    per_cell: dict[str, Any] = {}
    for name in CELLS:
        base, pool = name.split("/")
        cell = Cell(base, pool, ("uniform",))
        units = []
        for family in settings.families:
            values = []
            for run in range(settings.runs):
                record = kept_record(settings.records, record_key(family, run), RECORD_VERSION)
                arms = record["cells"][name]["arms"]
                uniform = {**arms["uniform"], grid_key(EXTRA_RATE): runs.arm(family, run, cell, "uniform", EXTRA_RATE)}
                ratio = arms["ratio"]
                _, ratio_test = chosen_test(ratio, settings.temperatures)
                rate, uniform_test = chosen_test(uniform, rates)
                values.append({"rate": rate, "uniform": uniform[grid_key(EXTRA_RATE)], "ratio_minus_uniform":
                               ratio_test - uniform_test, "uniform_test": uniform_test, "ratio_test": ratio_test})  # fmt: skip
            units.append(values)
        differences = [float(np.mean([v["ratio_minus_uniform"] for v in unit])) for unit in units]
        per_cell[name] = {"per_unit": differences, "mean": float(np.mean(differences)), "runs": units}
    return {"extra_rate": EXTRA_RATE, "grid": rates, "cells": per_cell}
