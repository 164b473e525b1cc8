"""atlantis-controls: the arms' rows and weights by hand, one micro family through the protocol's runner (every
cell, arm and grid value; the weak cell on the strong pool's rows; choices and endpoints recomputed by hand from
the record), resume without training, and a run another process holds."""

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset
from lab_helpers import MICRO, run_micro

from kinfolk.claims import claimed
from kinfolk.lab.experiments.atlantis_controls.arms import filtered_rows, training_rows, verifier_precision
from kinfolk.lab.experiments.atlantis_controls.experiment import (
    EXPLORATORY,
    LARGE_BASE_ONLY,
    PRIMARY,
    AtlantisControls,
    comparison_name,
)
from kinfolk.lab.experiments.atlantis_controls.runs import AtlantisControlsRuns, grid_key
from kinfolk.lab.experiments.atlantis_controls.settings import ControlsSettings


def test_arms_rows_and_weights_by_hand():
    a = np.array([-3.0, -1.0, -9.0, -2.0, -5.0, -4.0, -7.0, -6.0])
    scored = Dataset.from_dict(
        {"large_base_logprob": (a * 2).tolist(), "response_bytes": [2] * 8, "kind": ["good", "wrong"] * 4}
    )
    assert filtered_rows(scored, 0.25).tolist() == [1, 3]  # a per byte -1 and -2
    assert filtered_rows(scored, 0.5).tolist() == [0, 1, 3, 5]
    assert verifier_precision(scored, 0.5) == 0.25  # rows 0 (good), 1, 3 and 5 (wrong)
    rows, weights = training_rows(scored, "a-only", 2.0)
    assert rows.tolist() == list(range(8)) and weights.mean() == pytest.approx(1.0)
    clipped = np.clip(a / 2.0, *np.quantile(a / 2.0, [0.01, 0.99]))  # the library's default quantile clip
    expected = np.exp(clipped) / np.exp(clipped).mean()
    np.testing.assert_allclose(weights, expected, rtol=1e-12)
    rows, weights = training_rows(scored, "uniform", 3e-3)
    assert rows.tolist() == list(range(8)) and weights.tolist() == [1.0] * 8
    with pytest.raises(ValueError, match="none of the 8 rows is one"):
        training_rows(scored.map(lambda row: {"kind": "wrong"}), "oracle", 1.0)
    with pytest.raises(ValueError, match="unknown arm 'sideways'"):
        training_rows(scored, "sideways", 1.0)


def micro_settings(tmp_path: Path) -> ControlsSettings:
    return ControlsSettings(
        families=[0],
        runs=1,
        pool_size=24,
        steps=1,
        learning_rates=[1e-3, 3e-3],
        temperatures=[0.5, 1.0],
        filter_fractions=[0.25, 0.5],
        strong_arms=["uniform", "ratio", "a-only", "filter"],  # a micro model answers nothing right: no oracle
        eval_problems=3,
        validation_problems=3,
        work=str(tmp_path / "work"),
        records=str(tmp_path / "records"),
        family_overrides=MICRO,
    )


@pytest.fixture(scope="module")
def micro_run(lab_cache_dir, tmp_path_factory):
    """One micro family's run through the runner, under a plan written as `plan` writes it."""
    tmp_path = tmp_path_factory.mktemp("atlantis-controls")
    experiment = AtlantisControls(micro_settings(tmp_path))
    record, results = run_micro(experiment, lab_cache_dir, tmp_path)
    return experiment, record, results, tmp_path


def _best(grid: dict, values: list[float]) -> float:
    """The first grid value with the highest validation accuracy, by plain iteration."""
    best = values[0]
    for value in values[1:]:
        if grid[grid_key(value)]["validation"]["mean"] > grid[grid_key(best)]["validation"]["mean"]:
            best = value
    return best


def test_micro_family_runs_every_cell_arm_and_grid_value(micro_run):
    experiment, record, _, tmp_path = micro_run
    settings = experiment.settings
    assert set(record["cells"]) == {"strong/pr", "strong/pd-both", "weak/pr", "strong/pd-off_format"}
    for cell in settings.cells():
        arms = record["cells"][cell.name]["arms"]
        assert set(arms) == set(cell.arms)
        for arm, grid in arms.items():
            assert set(grid) == {grid_key(v) for v in settings.grid(arm)}
            for result in grid.values():
                assert {"validation", "test", "rows"} <= set(result)
    arms = record["cells"]["strong/pd-both"]["arms"]
    assert record["cells"]["strong/pd-both"]["rows"] == 24  # a p_d pool keeps every drawn row
    assert arms["filter"]["0.25"]["rows"] == 6 and arms["uniform"]["0.001"]["rows"] == 24
    run_dir = tmp_path / "work" / "0" / "run0"
    strong, weak = (Dataset.load_from_disk(str(run_dir / name / "scored")) for name in ("strong-pr", "weak-pr"))
    assert strong["completion"] == weak["completion"] and strong["prompt"] == weak["prompt"]  # the same rows
    assert record["bases"]["weak"]["steps"] <= record["bases"]["strong"]["steps"]


def test_micro_choices_and_endpoints_recomputed_by_hand(micro_run):
    experiment, record, results, _ = micro_run
    settings = experiment.settings
    chosen = results["selections"]["0"][0]
    accuracy = {}
    for cell in settings.cells():
        arms = record["cells"][cell.name]["arms"]
        for arm, grid in arms.items():
            value = _best(grid, settings.grid(arm))
            assert chosen[cell.name][arm] == value, (cell.name, arm)
            accuracy[cell.name, arm] = grid[grid_key(value)]["test"]["mean"]
        if "filter" in arms:
            a_only = arms["a-only"][grid_key(chosen[cell.name]["a-only"])]["validation"]["mean"]
            kept = arms["filter"][grid_key(chosen[cell.name]["filter"])]["validation"]["mean"]
            better = "a-only" if a_only >= kept else "filter"
            accuracy[cell.name, LARGE_BASE_ONLY] = accuracy[cell.name, better]
    for cell, method, baseline in (*PRIMARY, *(c for c in EXPLORATORY if "oracle" not in c)):
        entry = results["endpoints"][comparison_name(cell, method, baseline)]
        assert entry["per_unit"][0] == pytest.approx(accuracy[cell, method] - accuracy[cell, baseline], abs=1e-6)
    primaries = [name for name, entry in results["endpoints"].items() if entry["primary"]]
    assert primaries == [comparison_name(*c) for c in PRIMARY]
    weak = record["bases"]["weak"]["scores"]["reverse"]["answer_accuracy"]
    assert results["endpoints"]["weak base: reverse answer accuracy"]["per_unit"][0] == pytest.approx(weak)


def test_micro_run_resumes_from_its_kept_results_without_training(micro_run, lab_cache_dir, monkeypatch):
    experiment, record, _, tmp_path = micro_run
    monkeypatch.setenv("KINFOLK_LAB_CACHE", str(lab_cache_dir))

    def refuse(*args, **kwargs):
        raise AssertionError("a kept result was trained again")

    monkeypatch.setattr("kinfolk.lab.methods.atlantis.train_and_score", refuse)
    elsewhere = dataclasses.replace(experiment.settings, records=str(tmp_path / "records-again"))
    assert AtlantisControlsRuns(elsewhere).record(0, 0) == record  # every arm read back from the work folder


def test_an_arm_held_by_a_live_process_is_left_to_it(micro_run, lab_cache_dir, monkeypatch):
    experiment, _, _, tmp_path = micro_run
    monkeypatch.setenv("KINFOLK_LAB_CACHE", str(lab_cache_dir))
    work = tmp_path / "work-held"
    shutil.copytree(experiment.settings.work, work)  # every arm kept but the one another process is running
    held = work / "0" / "run0" / "strong-pr" / "uniform-0.001"
    (held / "result.json").unlink()

    def refuse(*args, **kwargs):
        raise AssertionError("an arm was trained: the held one, or a kept one again")

    monkeypatch.setattr("kinfolk.lab.methods.atlantis.train_and_score", refuse)
    settings = dataclasses.replace(experiment.settings, records=str(tmp_path / "records-held"), work=str(work))
    runs = AtlantisControlsRuns(settings)
    with claimed(held):
        assert runs.arm(0, 0, settings.cells()[0], "uniform", 1e-3) is None
        assert runs.record(0, 0) is None  # not whole while that arm is another process's
    assert not (Path(settings.records) / "0" / "0.json").exists()


def test_uniform_extension_reselects_over_the_extended_grid_by_hand(micro_run, lab_cache_dir, monkeypatch):
    from kinfolk.lab.experiments.atlantis_controls.extension import EXTRA_RATE, chosen_test, extend

    experiment, record, _, _ = micro_run
    monkeypatch.setenv("KINFOLK_LAB_CACHE", str(lab_cache_dir))
    settings = experiment.settings
    result = extend(settings)
    assert result["grid"] == [EXTRA_RATE, *settings.learning_rates]
    for name in ("strong/pr", "weak/pr"):
        arms = record["cells"][name]["arms"]
        extra = result["cells"][name]["runs"][0][0]["uniform"]
        uniform = {**arms["uniform"], grid_key(EXTRA_RATE): extra}
        rates = [EXTRA_RATE, *settings.learning_rates]
        best = rates[0]
        for rate in rates[1:]:  # the first rate with the highest validation accuracy
            if uniform[grid_key(rate)]["validation"]["mean"] > uniform[grid_key(best)]["validation"]["mean"]:
                best = rate
        _, ratio_test = chosen_test(arms["ratio"], settings.temperatures)
        expected = ratio_test - uniform[grid_key(best)]["test"]["mean"]
        assert result["cells"][name]["per_unit"] == [pytest.approx(expected)]


def test_chosen_test_takes_the_first_best_on_validation():
    from kinfolk.lab.experiments.atlantis_controls.extension import chosen_test

    grid = {"0.5": {"validation": {"mean": 0.7}, "test": {"mean": 0.1}},
            "1": {"validation": {"mean": 0.9}, "test": {"mean": 0.2}},
            "2": {"validation": {"mean": 0.9}, "test": {"mean": 0.3}}}  # fmt: skip
    assert chosen_test(grid, [2.0, 1.0, 0.5]) == (1.0, 0.2)
