"""What the family-runs experiments' tests share: a micro family's run under a plan written as `plan` writes it, and
the committed results recomputed from the committed plan and the kept records."""

import json
from pathlib import Path

import pytest

from kinfolk.lab.protocol.family_runs import FamilyRunsExperiment, record_key
from kinfolk.lab.protocol.plan import write_plan
from kinfolk.lab.protocol.records import kept_record
from kinfolk.lab.protocol.runner import run_experiment

ROOT = Path(__file__).resolve().parents[1]


def run_micro(experiment: FamilyRunsExperiment, tmp_path: Path) -> tuple[dict, dict]:
    """(family 0 run 0's record, the results) of `experiment` through the runner, its families built in `tmp_path`;
    the settings' records folder must be `tmp_path / "records"`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KINFOLK_LAB_CACHE", str(tmp_path / "lab"))
        plan_file = tmp_path / "plan.json"
        write_plan(experiment.plan(**experiment.plan_fields()), plan_file)
        results = run_experiment(experiment, plan_file, tmp_path / "protocol")
    return json.loads((tmp_path / "records" / "0" / "0.json").read_text()), results


def check_committed_results(experiment: FamilyRunsExperiment, tmp_path: Path, monkeypatch) -> None:
    """The committed results are what the committed plan and the kept records give (skips before the results are
    committed: the runs are committed family by family)."""
    results_file = ROOT / f"docs/results/{experiment.name}.json"
    if not results_file.exists():
        pytest.skip(f"{experiment.name} has no committed results yet")
    monkeypatch.chdir(ROOT)  # the plan's settings name the records relative to the repository
    s = experiment.settings
    version = experiment.record_version
    missing = [
        (f, r) for f in s.families for r in range(s.runs) if kept_record(s.records, record_key(f, r), version) is None
    ]
    assert not missing, f"runs {missing} have no kept record: the analysis would train them"
    results = run_experiment(experiment, ROOT / f"docs/results/{experiment.name}.plan.json", tmp_path)
    expected = json.loads(results_file.read_text())
    assert results["plan_sha256"] == expected["plan_sha256"]
    assert json.loads(json.dumps(results["endpoints"])) == expected["endpoints"]
