"""Every registered experiment, one tester (in the manner of PEFT's `PeftCommonTester`): it sits in its own folder,
keeps the contract (at most six primaries; it analyses exactly the endpoints it declares), its plan is the committed
plan byte for byte, the committed results are what `kinfolk lab experiment NAME analyse` makes of the committed plan
and the kept records (training nothing), and its selection stage cannot read a test field of the records it chooses
from."""

import functools
import hashlib
import json
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from lab_helpers import RESULTS, ROOT, committed, no_training

from kinfolk.lab.protocol import EXPERIMENTS, MAX_PRIMARIES, Experiment, SelectionView, TestFieldAccess, get_experiment
from kinfolk.lab.protocol.plan import sha256_of
from kinfolk.lab.protocol.views import TEST_FIELDS

NAMES = sorted(EXPERIMENTS)
# Experiments whose runs are under way: a plan committed, its units' records committed as they finish, no results
# yet. Their contract is checked on their first kept record once there is one, and in micro by their own test file.
IN_PROGRESS: set[str] = {"real-atlas-compare-gemma"}
FINISHED = sorted(set(NAMES) - IN_PROGRESS)
# (a shared-seed experiment: `kept` reads a seed's record wherever its runs class keys it)
WITH_A_RECORD = sorted(name for name in NAMES if name not in IN_PROGRESS or get_experiment(name)().kept(0) is not None)


@pytest.fixture(autouse=True)
def in_the_repository(monkeypatch):
    monkeypatch.chdir(ROOT)  # the plans' settings name the records relative to the repository


@functools.cache
def first_run(name: str) -> Mapping[str, Any]:
    """The raw record of the experiment's first unit's first run, as `load_run` gives it (read, never trained)."""
    experiment = get_experiment(name)()
    with no_training():
        return experiment.load_run(experiment.units()[0], 0)


def fields_named_test(record: Any, path: tuple = ()) -> list[tuple]:
    """The key paths of every field named like a test split, in the order a walk of the record meets them."""
    if isinstance(record, Mapping):
        found = []
        for key, value in record.items():
            found += [(*path, key)] if key in TEST_FIELDS else fields_named_test(value, (*path, key))
        return found
    if isinstance(record, Sequence) and not isinstance(record, str):
        return [p for index, value in enumerate(record) for p in fields_named_test(value, (*path, index))]
    return []


def test_the_registry_maps_onto_the_experiment_folders_one_to_one():
    folders = {p.parent.name for p in (ROOT / "kinfolk" / "lab" / "experiments").glob("*/__init__.py")}
    assert folders == {name.replace("-", "_") for name in EXPERIMENTS}
    for name, registered in EXPERIMENTS.items():
        assert registered.target.startswith(f"kinfolk.lab.experiments.{name.replace('-', '_')}."), name


def test_a_carried_primary_is_a_committed_primary_of_an_earlier_version_of_the_same_question():
    version = lambda name: int(json.loads((RESULTS / f"{name}.plan.json").read_text())["version"].split("-")[0])  # noqa: E731
    for name, registered in EXPERIMENTS.items():
        for entry in registered.carries:
            experiment, endpoint = entry.split(": ", 1)
            assert EXPERIMENTS[experiment].question == registered.question, entry
            assert version(experiment) < version(name), entry
            assert json.loads((RESULTS / f"{experiment}.json").read_text())["endpoints"][endpoint]["primary"], entry


def test_an_experiment_in_progress_has_no_results_and_a_finished_one_has():
    assert not [name for name in IN_PROGRESS if (RESULTS / f"{name}.json").exists()], "finished: move it to FINISHED"
    assert all((RESULTS / f"{name}.json").exists() for name in FINISHED)


@pytest.mark.parametrize("name", WITH_A_RECORD)
def test_the_experiment_keeps_the_contract(name):
    cls = get_experiment(name)
    assert issubclass(cls, Experiment) and cls.name == name
    experiment = cls()
    primaries = [e.name for e in experiment.primaries()]
    exploratory = [e.name for e in experiment.exploratory()]
    assert 1 <= len(primaries) <= MAX_PRIMARIES
    assert len(set(primaries + exploratory)) == len(primaries) + len(exploratory)  # no name twice
    assert all(e.baseline for e in experiment.primaries())
    assert experiment.units() and experiment.runs_per_unit() >= 1 and experiment.selection_rules()
    record = first_run(name)
    values = experiment.analyse(record, experiment.select(SelectionView(record)))
    assert set(values) == set(primaries) | set(exploratory)  # analysed: exactly the declared endpoints


@pytest.mark.parametrize("name", NAMES)
def test_its_plan_is_the_committed_plan(name):
    experiment = get_experiment(name)()
    text = experiment.plan(**experiment.plan_fields()).to_json()
    assert text == (RESULTS / f"{name}.plan.json").read_text()
    assert hashlib.sha256(text.encode()).hexdigest() == sha256_of(RESULTS / f"{name}.plan.json")


@pytest.mark.parametrize("name", FINISHED)
def test_the_committed_results_are_what_the_plan_and_the_kept_records_give(name, tmp_path, capsys):
    from kinfolk.commands import main

    shutil.copy(RESULTS / f"{name}.plan.json", tmp_path)
    argv = ["lab", "experiment", name, "analyse", "--results", str(tmp_path), "--work", str(tmp_path / "work")]
    with no_training():
        assert main(argv) == 0
    written, expected = json.loads((tmp_path / f"{name}.json").read_text()), committed(name)
    assert capsys.readouterr().out.strip() == f"{tmp_path / name}.json: plan {expected['plan_sha256'][:12]}"
    assert written["command"] == f"kinfolk lab experiment {name} analyse"  # not the --results or --work it had
    # `command` says what wrote the file, not what the plan and records give: the committed files were written by
    # `python -m kinfolk.lab.protocol analyse NAME`, which `kinfolk lab experiment NAME analyse` replaced
    assert {**written, "command": None} == {**expected, "command": None}


@pytest.mark.parametrize("name", WITH_A_RECORD)
def test_its_selection_cannot_read_a_test_field(name):
    experiment = get_experiment(name)()
    record = first_run(name)
    hidden = fields_named_test(record)
    assert hidden, "the record has no test field: there is nothing the view hides"
    experiment.select(SelectionView(record))  # the experiment's own selection reads none

    class Peeking(type(experiment)):
        def select(self, view):
            chosen = super().select(view)
            value = view
            for key in hidden[0]:  # the first test field, by its path
                value = value[key]
            return chosen

    with pytest.raises(TestFieldAccess):
        Peeking(experiment.settings).select(SelectionView(record))
