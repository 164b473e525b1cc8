"""The runner: an experiment's stages over the units and runs of its committed plan, resumable per run.

`run_experiment(experiment, plan_file, work)` checks that the plan file is the experiment's plan (same name,
version, units, runs, settings, selection rules and primaries), then, for every unit and run, reads back the run's
record from `work/<unit>/<run>.json` or makes it: `load_run`, `select` on the `SelectionView` (no test fields),
`analyse`. Each record names the hash of the plan it was made under; a record of another plan stops the runner
(`PlanMismatch`) rather than mixing runs of two plans into one result. `results(...)` summarises the records into
the results JSON (`analysis.summarise`, Holm over the primaries), carrying the plan's hash and the `command` that
wrote them (`kinfolk.lab.protocol.actions.analyse` names it; None for results written by other code).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from kinfolk.atomic import write_json
from kinfolk.lab.protocol.analysis import correct, summarise
from kinfolk.lab.protocol.experiment import Experiment
from kinfolk.lab.protocol.plan import Plan, PlanMismatch, load_plan
from kinfolk.lab.protocol.records import RunRecord
from kinfolk.lab.protocol.views import SelectionView


def check_plan(experiment: Experiment, plan: Plan) -> None:
    """Refuse a plan that is not what the experiment would run (a changed grid, rule, unit or primary)."""
    expected = experiment.plan(**experiment.plan_fields())
    differing = [f.name for f in dataclasses.fields(Plan) if getattr(expected, f.name) != getattr(plan, f.name)]
    if differing:
        raise PlanMismatch(
            f"the committed plan of {plan.experiment} v{plan.version} differs from the experiment in {differing}: "
            "a changed plan is a new version"
        )


def run_record(experiment: Experiment, unit: int, run: int, plan_sha256: str, work: Path) -> RunRecord:
    """One run's record, read back when it was made under this plan, made (and kept) otherwise."""
    path = work / str(unit) / f"{run}.json"
    if path.exists():
        record = RunRecord.from_dict(json.loads(path.read_text()))
        if record.plan_sha256 != plan_sha256:
            raise PlanMismatch(
                f"{path} was made under plan {record.plan_sha256[:12]}, not the committed {plan_sha256[:12]}: "
                "results of runs started under another plan are not written"
            )
        return record
    raw = experiment.load_run(unit, run)
    selection = experiment.select(SelectionView(raw))
    values = experiment.analyse(raw, selection)
    declared = {e.name for e in experiment.primaries()} | {e.name for e in experiment.exploratory()}
    if set(values) != declared:
        raise ValueError(
            f"{experiment.name}: analyse returned {sorted(set(values) ^ declared)} beyond or short of "
            "the declared endpoints"
        )
    record = RunRecord(experiment.name, unit, run, plan_sha256, selection, values)
    write_json(path, record.to_dict())
    return record


def run_experiment(
    experiment: Experiment, plan_file: str | Path, work: str | Path, command: str | None = None
) -> dict[str, Any]:
    """Every unit's and run's record under the committed plan, summarised into the results JSON."""
    plan, plan_sha256 = load_plan(plan_file)
    check_plan(experiment, plan)
    work = Path(work) / experiment.name / plan_sha256[:16]
    records = [
        [run_record(experiment, unit, run, plan_sha256, work) for run in range(plan.runs_per_unit)]
        for unit in plan.units
    ]
    return results(experiment, plan, plan_sha256, records, command)


def results(
    experiment: Experiment,
    plan: Plan,
    plan_sha256: str,
    records: list[list[RunRecord]],
    command: str | None = None,
) -> dict[str, Any]:
    """The results JSON from every unit's records (outer list: units, in the plan's order; inner: runs)."""
    if any(r.plan_sha256 != plan_sha256 for unit in records for r in unit):
        raise PlanMismatch(f"{experiment.name}: records of another plan among the runs")
    endpoints: dict[str, dict[str, Any]] = {}
    for primary, declared in ((True, experiment.primaries()), (False, experiment.exploratory())):
        for endpoint in declared:
            runs = [[r.values[endpoint.name] for r in unit] for unit in records]
            endpoints[endpoint.name] = summarise(endpoint, runs, primary, experiment.floor(endpoint.name),
                                                 experiment.value_range(endpoint.name))  # fmt: skip
    correct(endpoints)
    return {
        "experiment": plan.experiment,
        "version": plan.version,
        "command": command,
        "plan_sha256": plan_sha256,
        "reanalysis": plan.reanalysis,
        "runs_commit": plan.runs_commit,
        "units": plan.units,
        "unit_kind": plan.unit_kind,
        "runs_per_unit": plan.runs_per_unit,
        **experiment.provenance(),
        "selections": {str(unit[0].unit): [r.selection for r in unit] for unit in records},
        "endpoints": endpoints,
    }
