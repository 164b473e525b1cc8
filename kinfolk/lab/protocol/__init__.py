"""The lab's experiment framework: the protocol (`docs/protocol.md`) built into the code.

`plan` (committed plans and their hashes), `views` (records with the test split unreachable), `records` (typed,
versioned per-run records), `experiment` (the `Experiment` contract: settings, endpoints, selection and analysis
stages, and how its runs are made), `analysis` (intervals, tests and Holm over units), `runner` (the stages over
units and runs, resumable, refusing runs of another plan), `family_runs` (experiments whose runs are kept as
per-family records), `reanalysis` (experiments over an earlier version's committed records), `sentences` (what each
primary's claim lets the results say, from its plan or an addendum written after the results), `claims` (processes
started alike sharing runs) and `actions` (what `kinfolk lab experiment NAME plan|run|analyse` does).
`EXPERIMENTS` lists every experiment, by name, as the import path of its class, so listing them imports nothing heavy:

>>> sorted(EXPERIMENTS)  # doctest: +NORMALIZE_WHITESPACE
['adapt', 'adapt-compute', 'adapt-controls', 'adapt-frontier', 'atlantis', 'atlantis-controls', 'atlas', 'atlas-controls', 'real-atlas',
 'real-atlas-compare', 'real-boomerang', 'real-boomerang-compute', 'real-boomerang-controls']
>>> get_experiment("atlas").name
'atlas'
"""

from __future__ import annotations

import importlib

from kinfolk.lab.protocol.experiment import Experiment, ExploratoryEndpoint
from kinfolk.lab.protocol.plan import MAX_PRIMARIES, Plan, PlanError, PlanMismatch, PrimaryEndpoint
from kinfolk.lab.protocol.records import EndpointValue, RunRecord
from kinfolk.lab.protocol.views import SelectionView, TestFieldAccess

EXPERIMENTS: dict[str, str] = {
    "atlantis": "kinfolk.lab.experiments.atlantis.experiment:AtlantisReanalysis",
    "atlas": "kinfolk.lab.experiments.atlas.experiment:AtlasReanalysis",
    "adapt": "kinfolk.lab.experiments.adapt.experiment:AdaptReanalysis",
    "real-boomerang": "kinfolk.lab.experiments.real_boomerang.experiment:RealBoomerang",
    "real-boomerang-controls": "kinfolk.lab.experiments.real_boomerang_controls.experiment:RealBoomerangControls",
    "real-boomerang-compute": "kinfolk.lab.experiments.real_boomerang_compute.experiment:RealBoomerangCompute",
    "real-atlas": "kinfolk.lab.experiments.real_atlas.experiment:RealAtlas",
    "real-atlas-compare": "kinfolk.lab.experiments.real_atlas_compare.experiment:RealAtlasCompare",
    "atlantis-controls": "kinfolk.lab.experiments.atlantis_controls.experiment:AtlantisControls",
    "atlas-controls": "kinfolk.lab.experiments.atlas_controls.experiment:AtlasControls",
    "adapt-controls": "kinfolk.lab.experiments.adapt_controls.experiment:AdaptControls",
    "adapt-frontier": "kinfolk.lab.experiments.adapt_frontier.experiment:AdaptFrontier",
    "adapt-compute": "kinfolk.lab.experiments.adapt_compute.experiment:AdaptCompute",
}


def get_experiment(name: str) -> type[Experiment]:
    """The experiment class registered under `name`."""
    if name not in EXPERIMENTS:
        raise KeyError(f"unknown experiment {name!r}: {', '.join(sorted(EXPERIMENTS))}")
    module, attribute = EXPERIMENTS[name].split(":")
    return getattr(importlib.import_module(module), attribute)


__all__ = [
    "EXPERIMENTS",
    "MAX_PRIMARIES",
    "EndpointValue",
    "Experiment",
    "ExploratoryEndpoint",
    "Plan",
    "PlanError",
    "PlanMismatch",
    "PrimaryEndpoint",
    "RunRecord",
    "SelectionView",
    "TestFieldAccess",
    "get_experiment",
]
