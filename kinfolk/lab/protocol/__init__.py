"""The lab's experiment framework: the protocol (`docs/protocol.md`) built into the code.

`plan` (committed plans and their hashes), `views` (records with the test split unreachable), `records` (typed,
versioned per-run records), `experiment` (the `Experiment` contract: settings, endpoints, selection and analysis
stages, and how its runs are made), `analysis` (intervals, tests and Holm over units), `runner` (the stages over
units and runs, resumable, refusing runs of another plan), `family_runs` (experiments whose runs are kept as
per-family records), `reanalysis` (experiments over an earlier version's committed records), `sentences` (what each
primary's claim lets the results say, from its plan or an addendum written after the results), `claims` (processes
started alike sharing runs) and `actions` (what `kinfolk lab experiment NAME plan|run|analyse` does).
`EXPERIMENTS` lists every experiment, by name, with the import path of its class (so listing them imports nothing
heavy) and the question it answers:

>>> sorted(EXPERIMENTS)  # doctest: +NORMALIZE_WHITESPACE
['adapt', 'adapt-compute', 'adapt-controls', 'adapt-frontier', 'atlantis', 'atlantis-controls', 'atlas', 'atlas-controls', 'real-atlas',
 'real-atlas-compare', 'real-atlas-compare-gemma', 'real-boomerang', 'real-boomerang-compute', 'real-boomerang-controls']
>>> get_experiment("atlas").name, EXPERIMENTS["atlas"].question
('atlas', 'ATLAS')
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from kinfolk.lab.protocol.experiment import Experiment, ExploratoryEndpoint
from kinfolk.lab.protocol.plan import MAX_PRIMARIES, Plan, PlanError, PlanMismatch, PrimaryEndpoint
from kinfolk.lab.protocol.records import EndpointValue, RunRecord
from kinfolk.lab.protocol.views import SelectionView, TestFieldAccess


@dataclass(frozen=True)
class Registered:
    """One registered experiment: its class as an import path (`module:Class`, imported only when asked for), the
    question it answers (the README and the results page quote only the newest version of each question) and the
    primaries of the question's earlier versions that it does not ask again, as "<experiment>: <endpoint>": they
    stay quoted beside its own (a version that asks one part of a question again supersedes that part only)."""

    target: str
    question: str
    carries: tuple[str, ...] = ()


# In the order the README and the results page take the questions.
EXPERIMENTS: dict[str, Registered] = {
    "atlantis": Registered("kinfolk.lab.experiments.atlantis.experiment:AtlantisReanalysis", "ATLANTIS"),
    "atlantis-controls": Registered(
        "kinfolk.lab.experiments.atlantis_controls.experiment:AtlantisControls", "ATLANTIS"
    ),
    "atlas": Registered("kinfolk.lab.experiments.atlas.experiment:AtlasReanalysis", "ATLAS"),
    "atlas-controls": Registered("kinfolk.lab.experiments.atlas_controls.experiment:AtlasControls", "ATLAS"),
    "adapt": Registered("kinfolk.lab.experiments.adapt.experiment:AdaptReanalysis", "ADAPT"),
    "adapt-controls": Registered("kinfolk.lab.experiments.adapt_controls.experiment:AdaptControls", "ADAPT"),
    "adapt-frontier": Registered("kinfolk.lab.experiments.adapt_frontier.experiment:AdaptFrontier", "ADAPT"),
    "adapt-compute": Registered(
        "kinfolk.lab.experiments.adapt_compute.experiment:AdaptCompute",
        "ADAPT",
        carries=(  # it asks distillation at equal compute again and drops depth; routing and format stand
            "adapt-frontier: routing/distilled: routed - random-mix frontier",
            "adapt-frontier: routing/weight-delta: routed - random-mix frontier",
            "adapt-frontier: format: transfer split, bracket-sft - preferred-sft",
        ),
    ),
    "real-atlas": Registered("kinfolk.lab.experiments.real_atlas.experiment:RealAtlas", "ATLAS, real checkpoint"),
    "real-atlas-compare": Registered(
        "kinfolk.lab.experiments.real_atlas_compare.experiment:RealAtlasCompare", "ATLAS, real checkpoint"
    ),
    "real-atlas-compare-gemma": Registered(
        "kinfolk.lab.experiments.real_atlas_compare_gemma.experiment:RealAtlasCompareGemma",
        "ATLAS, second real checkpoint",
    ),
    "real-boomerang": Registered(
        "kinfolk.lab.experiments.real_boomerang.experiment:RealBoomerang", "ADAPT, real checkpoint"
    ),
    "real-boomerang-controls": Registered(
        "kinfolk.lab.experiments.real_boomerang_controls.experiment:RealBoomerangControls", "ADAPT, real checkpoint"
    ),
    "real-boomerang-compute": Registered(
        "kinfolk.lab.experiments.real_boomerang_compute.experiment:RealBoomerangCompute", "ADAPT, real checkpoint"
    ),
}


def get_experiment(name: str) -> type[Experiment]:
    """The experiment class registered under `name`."""
    if name not in EXPERIMENTS:
        raise KeyError(f"unknown experiment {name!r}: {', '.join(sorted(EXPERIMENTS))}")
    module, attribute = EXPERIMENTS[name].target.split(":")
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
    "Registered",
    "RunRecord",
    "SelectionView",
    "TestFieldAccess",
    "get_experiment",
]
