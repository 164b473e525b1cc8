"""The experiments' shared runner: every seed run once on one family, the files written, nothing overwritten."""

import json

import pytest

from kinfolk.atomic import OutputExistsError
from kinfolk.lab.family import LabConfig
from kinfolk.lab.seeded import run_over_seeds
from tests.test_lab_family import MICRO


def test_every_seed_runs_on_one_family_and_both_files_are_written(tmp_path):
    calls = []

    def run_seed(family, seed):
        calls.append((family.root, seed))
        return {"value": 10 * seed}

    def summarise(per_seed):
        return {"total": sum(entry["value"] for entry in per_seed)}

    out = tmp_path / "out"
    config = LabConfig(**MICRO, seed=3)
    results = run_over_seeds(
        "probe",
        out,
        3,
        config,
        {"steps": 7},
        run_seed,
        summarise,
        lambda results: ["# probe", f"total {results['summary']['total']}"],
        cache_dir=tmp_path / "lab",
    )
    assert [seed for _, seed in calls] == [0, 1, 2] and len({root for root, _ in calls}) == 1
    assert results["summary"] == {"total": 30} and results["family_seed"] == 3
    assert json.loads((out / "results.json").read_text()) == results
    page = (out / "results.md").read_text().split("\n\n")
    assert page[:2] == ["# probe", "total 30"] and page[2].startswith("Time: ")

    with pytest.raises(OutputExistsError, match="--overwrite"):
        run_over_seeds("probe", out, 1, config, {}, run_seed, summarise, lambda r: [], cache_dir=tmp_path / "lab")
    assert len(calls) == 3  # refused before any seed ran
