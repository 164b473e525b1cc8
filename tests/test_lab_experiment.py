"""The ATLANTIS experiment: estimands by hand, endpoints from a hand-made record, the families runner (resume,
protocol format, results that the protocol's checker `kinfolk lab check` passes), and one micro family end to end."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from datasets import Dataset

from kinfolk.lab import replication
from kinfolk.lab.methods.atlantis import (
    ENDPOINTS,
    LOG_ESTIMAND,
    AtlantisSettings,
    atlantis_family,
    log_estimand,
    oracle_weights,
)
from kinfolk.lab.methods.replication import Endpoint, run_families
from kinfolk.lab.protocol.checks import check_results
from kinfolk.stats import t_interval


def test_estimands_by_hand():
    scored = Dataset.from_dict(
        {
            "prompt": ["rev abcd=", "rev abcd=", "copy abcd="],
            "completion": ["dcba", "[dcba]", "abcd"],
            "skill": ["reverse", "reverse", "copy"],
            "kind": ["good", "off_format", "good"],
            "pool_logprob": [math.log(0.4), math.log(0.15), math.log(0.4)],
            "reference_logprob": [math.log(0.02), math.log(0.3), math.log(0.9)],
        }
    )
    # p_d pool: p*/p_d = 1/0.4 on ideal responses, 0 elsewhere
    assert np.exp(log_estimand(scored, "pd-both")).tolist() == pytest.approx([2.5, 0.0, 2.5])
    # Eq. 7's own setting: p*/p_r = 1/p_r(y|x) on ideal responses
    assert np.exp(log_estimand(scored, "pr")).tolist() == pytest.approx([50.0, 0.0, 1 / 0.9])
    # half p_r, half p_d (both noises): q = (p_r + p_d) / 2
    assert np.exp(log_estimand(scored, "mix")).tolist() == pytest.approx([1 / 0.21, 0.0, 1 / 0.65])
    with_estimand = scored.add_column(LOG_ESTIMAND, log_estimand(scored, "pr").tolist())
    assert oracle_weights(with_estimand).tolist() == pytest.approx(
        [50 * 3 / (50 + 1 / 0.9), 0.0, (1 / 0.9) * 3 / (50 + 1 / 0.9)]
    )


def _training(uniform: float, ratio: float, permuted: float) -> dict:
    def entry(mean: float) -> dict:
        return {"test": {"mean": mean}}

    return {"uniform": entry(uniform), "ratio": entry(ratio), "ratio-permuted": entry(permuted), "oracle": None}


def test_primary_endpoints_read_paired_differences_per_run():
    record = {
        "runs": [
            {"cells": {"pr": {"training": _training(0.5, 0.7, 0.55)}}},
            {"cells": {"pr": {"training": _training(0.4, 0.5, 0.45)}}},
        ]
    }
    by_name = {e.name: e for e in ENDPOINTS}
    assert by_name["pr/ratio - uniform"].primary
    assert by_name["pr/ratio - uniform"].value(record) == pytest.approx([0.2, 0.1])
    assert by_name["pr/ratio - permuted"].value(record) == pytest.approx([0.15, 0.05])
    assert all(math.isnan(v) for v in by_name["pr/oracle - uniform"].value(record))  # no oracle run: no value
    assert not by_name["pr/oracle - uniform"].primary


def _stub_family(seed: int, passed: bool = True):
    return SimpleNamespace(
        root=Path(f"/families/key{seed}"), passed=passed, checks=[], config=SimpleNamespace(seed=seed)
    )


def test_run_families_resumes_and_writes_the_protocol_format(tmp_path, monkeypatch):
    monkeypatch.setattr(replication, "build_family", lambda config, **kwargs: _stub_family(config.seed))
    calls = []
    gains = {0: 0.21, 1: 0.25, 2: 0.19, 3: 0.30, 4: 0.22}

    def run_family(family, work):
        calls.append(family.config.seed)
        return {"gain": [gains[family.config.seed], gains[family.config.seed]]}

    endpoints = [Endpoint("gain", "test gain", lambda r: r["gain"], baseline="uniform", primary=True)]
    args = ("toy", tmp_path / "out", [0, 1, 2], lambda seed: SimpleNamespace(seed=seed), run_family, endpoints)
    first = run_families(*args, {"steps": 1}, progress=False)
    assert calls == [0, 1, 2] and first["endpoints"]["gain"]["ci95"] is None  # 3 families: values only
    calls.clear()
    args = (*args[:2], [0, 1, 2, 3, 4], *args[3:])
    results = run_families(*args, {"steps": 1}, progress=False)
    assert calls == [3, 4]  # families 0-2 were read back, not rerun
    entry = results["endpoints"]["gain"]
    assert entry["per_family"] == [0.21, 0.25, 0.19, 0.30, 0.22]
    interval = t_interval(entry["per_family"])
    assert entry["ci95"] == pytest.approx([interval.low, interval.high], abs=1e-6)  # rounded to 6 places
    assert entry["favours_method"] == 5 and entry["primary"]
    assert results["families"] == [0, 1, 2, 3, 4] and results["threshold_pass_rate"] == 1.0
    calls.clear()
    run_families(*args, {"steps": 2}, progress=False)  # other settings: nothing is reused
    assert calls == [0, 1, 2, 3, 4]
    check = check_results(tmp_path / "out" / "results.json")  # the protocol's own checker agrees with the file
    assert check.kind == "protocol-1" and check.passed, check.lines()


def test_an_endpoint_undefined_in_a_family_is_reported_without_an_interval(tmp_path, monkeypatch):
    from kinfolk.lab.demo.results_page import endpoint_table

    monkeypatch.setattr(replication, "build_family", lambda config, **kwargs: _stub_family(config.seed))
    reached = {0: 0.1, 1: None, 2: 0.3, 3: float("nan"), 4: 0.2}  # families 1 and 3 never reach the level
    endpoints = [Endpoint("kl", "log KL ratio", lambda r: [r["kl"]], baseline="lora", primary=True)]
    results = run_families(
        "toy",
        tmp_path / "out",
        list(reached),
        lambda seed: SimpleNamespace(seed=seed),
        lambda family, work: {"kl": reached[family.config.seed]},
        endpoints,
        {},
        progress=False,
    )
    entry = results["endpoints"]["kl"]
    assert entry["per_family"] == [0.1, None, 0.3, None, 0.2] and entry["undefined_families"] == 2
    assert entry["mean"] == pytest.approx(0.2) and entry["favours_method"] == 3 and entry["ci95"] is None
    row = endpoint_table(results).splitlines()[-1]
    assert "values only (3 families; undefined in 2)" in row and "n/a" in row and "3 of 3" in row
    check = check_results(tmp_path / "out" / "results.json")
    assert check.kind == "protocol-1" and check.passed, check.lines()


def test_one_micro_family_runs_every_cell_and_control(tmp_path):
    from kinfolk.lab.world.family import LabConfig, build_family
    from kinfolk.stats import effective_sample_size
    from tests.test_lab_family import MICRO

    family = build_family(LabConfig(**MICRO), cache_dir=tmp_path / "lab", progress=False)
    settings = AtlantisSettings(
        pool_size=24,
        steps=1,
        temperatures=[1.0, 2.0],
        diagnostic_temperatures=[1.0],
        training_cells=["pd-both"],
        eval_problems=3,
        validation_problems=3,
    )
    record = atlantis_family(family, tmp_path / "work", settings)
    run = record["runs"][0]
    assert set(run["cells"]) == {"pd-both", "pd-wrong", "pd-off_format", "pr", "mix"}
    assert (
        run["cells"]["pd-wrong"]["kinds"]["off_format"] == 0 and run["cells"]["pd-off_format"]["kinds"]["wrong"] == 0
    )
    training = run["cells"]["pd-both"]["training"]
    assert set(training) == {
        "uniform",
        "oracle",
        "ratio",
        "ratio-permuted",
        "algorithm1",
        "algorithm1-permuted",
        "influence",
        "influence-permuted",
    }
    for formula in ("ratio", "algorithm1", "influence"):
        chosen = training[formula]
        best = max(chosen["by_temperature"].values(), key=lambda r: r["validation"]["mean"])
        assert chosen["validation"] == best["validation"]  # chosen on validation, not test
        assert training[f"{formula}-permuted"]["ess_fraction"] == pytest.approx(chosen["ess_fraction"])
    diagnostics = run["cells"]["pd-both"]["diagnostics"]
    assert diagnostics["oracle"]["auc_good"] == 1.0 and diagnostics["oracle"]["mass_good"] == pytest.approx(1.0)
    assert {"ratio/byte/1", "algorithm1/none/1", "influence/token/1"} <= set(diagnostics)
    uniform_ess = effective_sample_size(np.ones(24)) / 24
    assert training["uniform"]["ess_fraction"] == pytest.approx(uniform_ess)
    again = atlantis_family(family, tmp_path / "work", settings)  # every piece is read back from the work dir
    assert json.dumps(again, sort_keys=True) == json.dumps(record, sort_keys=True)  # NaN-safe equality


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["lab", "experiment", "atlantis", "--families", "0"], "--families must be at least 1, got 0"),
        (["lab", "experiment", "atlantis", "--temperature", "1"], "unrecognized arguments: --temperature"),
        (["lab", "experiment", "sideways"], "unknown experiment 'sideways'"),
        (["lab"], "kinfolk lab needs an action"),
    ],
)
def test_lab_command_refuses_bad_input_in_one_line(argv, message, capsys, tmp_path, monkeypatch):
    from kinfolk.commands import main

    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as usage_error:  # the option parser's own exit
        code = usage_error.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


def test_results_page_agrees_with_its_data(tmp_path):
    from kinfolk.lab.demo.results_page import update_results_page

    root = Path(__file__).resolve().parents[1] / "docs"
    if not list((root / "results").glob("*.json")):
        pytest.skip("no committed results")
    page = tmp_path / "results.md"
    page.write_text((root / "results.md").read_text())
    assert update_results_page(page, root / "results") == (root / "results.md").read_text(), (
        "docs/results.md's generated tables are stale: run python -m kinfolk.lab.demo.results_page"
    )
