"""What `kinfolk lab experiment NAME plan|run|analyse` does with a registered experiment.

- `write_experiment_plan`: the experiment's plan file `<results>/<name>.plan.json`, written once (the same plan
  again leaves the file as it is; another plan under that name is refused: a changed plan is a new version);
- `make_runs`: the records of the plan's units and runs (or of the ones asked for), each made by the experiment's
  `make_run` and kept; processes started alike share them (a run another live process holds is left to it and
  waited for, `claims.until_made`), and torch runs on one thread (two processes on two cores; one thread gives
  every reduction one order). `run_keys` checks what is asked before: a re-analysis has no runs to make (it reads
  committed records), and a unit or run outside the plan is refused;
- `analyse`: the runner over the committed plan (`runner.run_experiment`), written to `<results>/<name>.json`.
  The results' `command` is the command that writes them, whatever options placed its files.

>>> analyse_command("atlas")
'kinfolk lab experiment atlas analyse'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kinfolk.atomic import write_json
from kinfolk.claims import until_made
from kinfolk.errors import InputError
from kinfolk.lab.protocol.experiment import Experiment
from kinfolk.lab.protocol.plan import plan_path, write_plan
from kinfolk.lab.protocol.runner import run_experiment

RESULTS_DIR = "docs/results"
WORK_DIR = "runs/protocol"


def analyse_command(name: str) -> str:
    """The command that writes an experiment's results file (its `command` field)."""
    return f"kinfolk lab experiment {name} analyse"


def write_experiment_plan(experiment: Experiment, results_dir: str | Path = RESULTS_DIR) -> tuple[Path, str]:
    """The experiment's plan file and its SHA-256, written unless that very plan is there already."""
    path = plan_path(results_dir, experiment.name)
    return path, write_plan(experiment.plan(**experiment.plan_fields()), path)


def chosen(asked: Sequence[int] | None, planned: Sequence[int], what: str, name: str) -> list[int]:
    """The plan's units (or runs) that were asked for, all of them by default; one outside the plan is refused.

    >>> chosen(None, [0, 1, 2], "families", "x"), chosen([2, 0], [0, 1, 2], "families", "x")
    ([0, 1, 2], [2, 0])
    """
    if asked is None:
        return list(planned)
    outside = [value for value in asked if value not in planned]
    if outside:
        raise InputError(f"{name}: {what} {outside} are not in its plan ({what}: {list(planned)})")
    return list(asked)


def run_keys(
    experiment: Experiment, units: Sequence[int] | None = None, runs: Sequence[int] | None = None
) -> list[tuple[int, int]]:
    """The (unit, run) pairs asked for, checked against the plan before anything is made."""
    reason = experiment.runs_made_elsewhere()
    if reason is not None:
        raise InputError(reason)
    units = chosen(units, experiment.units(), f"{experiment.unit_kind} units", experiment.name)
    runs = chosen(runs, range(experiment.runs_per_unit()), "runs", experiment.name)
    return [(unit, run) for unit in units for run in runs]


def make_runs(experiment: Experiment, keys: list[tuple[int, int]]) -> list[Mapping[str, Any]]:
    """Each (unit, run)'s record, made and kept, in the order of `keys`."""
    import torch

    made: dict[tuple[int, int], Mapping[str, Any]] = {}

    def make(key: tuple[int, int]) -> Mapping[str, Any] | None:
        record = experiment.make_run(*key)
        if record is not None:
            made[key] = record
        return record

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        until_made(make, keys)
    finally:
        torch.set_num_threads(threads)
    return [made[key] for key in keys]


def analyse(
    experiment: Experiment, results_dir: str | Path = RESULTS_DIR, work: str | Path = WORK_DIR
) -> tuple[Path, dict[str, Any]]:
    """The results under the committed plan, written to `<results_dir>/<name>.json` (the file and the results)."""
    results = run_experiment(
        experiment, plan_path(results_dir, experiment.name), work, analyse_command(experiment.name)
    )
    path = Path(results_dir) / f"{experiment.name}.json"
    write_json(path, results)
    return path, results
