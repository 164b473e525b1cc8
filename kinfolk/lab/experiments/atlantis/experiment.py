"""ATLANTIS re-analysed under protocol 2: does importance weighting beat plain SFT on the same pool?

The committed runs (`docs/results/atlantis-families/`, one pool draw per family) trained the large base on each
training cell's pool with uniform weights, each formula's weights at every temperature of its grid, the oracle's
and the formula's weights permuted. Selection (validation view only): per cell and formula, the temperature with the
highest validation accuracy (ties: the lower temperature). Primary endpoints, paired in each family: test accuracy
of the selected formula minus uniform SFT, in the `pr` (pure reference) and `pd-both` cells. Exploratory: each
formula minus its permuted weights (do the weights matter beyond their spread?) and the oracle minus uniform.

>>> experiment = AtlantisReanalysis()
>>> [e.name for e in experiment.primaries()][:2]
['pr/ratio - uniform', 'pr/algorithm1 - uniform']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kinfolk.lab.protocol.experiment import ExploratoryEndpoint
from kinfolk.lab.protocol.plan import PrimaryEndpoint
from kinfolk.lab.protocol.reanalysis import Reanalysis, grid_key
from kinfolk.lab.protocol.records import EndpointValue
from kinfolk.lab.protocol.views import SelectionView
from kinfolk.stats import on_grid_edge


@dataclass(frozen=True)
class AtlantisReanalysisSettings:
    """What the re-analysis reads and compares."""

    cells: list[str] = field(default_factory=lambda: ["pr", "pd-both"], metadata={"help": "Training cells."})
    formulas: list[str] = field(
        default_factory=lambda: ["ratio", "algorithm1", "influence"], metadata={"help": "Weight formulas."}
    )
    temperatures: list[float] = field(
        default_factory=lambda: [0.5, 1.0, 2.0], metadata={"help": "The committed runs' temperature grid."}
    )


class AtlantisReanalysis(Reanalysis):
    name = "atlantis"
    version = "2-reanalysis"
    settings_class = AtlantisReanalysisSettings
    records_dir = "atlantis-families"
    runs_commit = "2227fd38ce462fcaa4bdce2d2a2c599ffe296692"
    notes = (
        "Re-analysis of version-1 runs whose results had been seen; this plan was written afterwards, so its choice "
        "of primaries is not blind. Its primaries are the earlier version's formula-minus-uniform endpoints.",
        "One run (pool draw) per family: the two-stage cluster bootstrap reduces to a bootstrap over families.",
        "Trained at LAB_VERSION 3, under TRL's default bf16=True (CPU bf16 autocast) in lab_trainer.",
    )

    def primaries(self) -> list[PrimaryEndpoint]:
        return [
            PrimaryEndpoint(
                f"{cell}/{formula} - uniform",
                f"{cell}: test accuracy of SFT weighted by {formula} (temperature chosen on validation) minus "
                "uniform SFT on the same pool",
                baseline="uniform",
                direction="higher",
            )
            for cell in self.settings.cells
            for formula in self.settings.formulas
        ]

    def exploratory(self) -> list[ExploratoryEndpoint]:
        endpoints = [
            ExploratoryEndpoint(
                f"{cell}/{formula} - permuted",
                f"{cell}: test accuracy of {formula} weights minus the same weights permuted over the pool (the "
                "arm for 'any weights of this spread would do'; permuted at the committed run's temperature)",
                baseline="permuted",
            )
            for cell in self.settings.cells
            for formula in self.settings.formulas
        ]
        endpoints += [
            ExploratoryEndpoint(
                f"{cell}/oracle - uniform", f"{cell}: test accuracy of the oracle's weights minus uniform", "uniform"
            )
            for cell in self.settings.cells
        ]
        return endpoints

    def selection_rules(self) -> dict[str, str]:
        return {
            "temperature": "per cell and formula, the temperature of the grid with the highest validation accuracy "
            "(mean over the scored skills); ties go to the lower temperature"
        }

    def split_record(self, committed: dict[str, Any], run: int) -> dict[str, Any]:
        cells = committed["runs"][run]["cells"]
        return {cell: cells[cell]["training"] for cell in self.settings.cells}

    def select(self, view: SelectionView) -> dict[str, Any]:
        chosen: dict[str, Any] = {}
        for cell in self.settings.cells:
            for formula in self.settings.formulas:
                by_temperature = view[cell][formula]["by_temperature"]
                best = max(
                    self.settings.temperatures,
                    key=lambda t: (by_temperature[grid_key(t)]["validation"]["mean"], -t),
                )
                chosen[f"{cell}/{formula}"] = best
        return chosen

    def analyse(self, record: Mapping[str, Any], selection: dict[str, Any]) -> dict[str, EndpointValue]:
        values: dict[str, EndpointValue] = {}
        grid = self.settings.temperatures
        for cell in self.settings.cells:
            training = record[cell]
            uniform = training["uniform"]["test"]["mean"]
            for formula in self.settings.formulas:
                temperature = selection[f"{cell}/{formula}"]
                ours = training[formula]["by_temperature"][grid_key(temperature)]["test"]["mean"]
                edge = on_grid_edge(temperature, grid)
                values[f"{cell}/{formula} - uniform"] = EndpointValue(ours - uniform, ours, uniform, edge)
                committed = training[formula]["test"]["mean"]
                permuted = training[f"{formula}-permuted"]["test"]["mean"]
                values[f"{cell}/{formula} - permuted"] = EndpointValue(committed - permuted, committed, permuted)
            oracle = training["oracle"]["test"]["mean"]
            values[f"{cell}/oracle - uniform"] = EndpointValue(oracle - uniform, oracle, uniform)
        return values
