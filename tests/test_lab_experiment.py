"""`kinfolk lab experiment NAME plan|run|analyse` (bad input refused in one line, an unknown name before torch loads,
a plan never written over; `analyse` runs in the contract tester, `run`'s resume in test_interrupts.py) and
ATLANTIS's methods: estimands by hand and one micro family through every cell and control."""

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset
from lab_helpers import RESULTS

from kinfolk.lab.methods.atlantis import LOG_ESTIMAND, AtlantisSettings, atlantis_family, log_estimand, oracle_weights


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


def test_one_micro_family_runs_every_cell_and_control(micro_family, tmp_path):
    from kinfolk.stats import effective_sample_size

    family = micro_family
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
        (
            ["lab", "experiment", "sideways"],
            "unknown experiment 'sideways'; choose an experiment: adapt, adapt-compute, adapt-controls",
        ),
        (["lab", "experiment"], "unknown experiment '(none)'"),
        (
            ["lab", "experiment", "atlas"],
            "kinfolk lab experiment atlas needs an action: plan | run | analyse (got none)",
        ),
        (["lab", "experiment", "atlas", "rerun"], "needs an action: plan | run | analyse (got rerun)"),
        (
            ["lab", "experiment", "atlas", "run"],
            "atlas re-analyses the committed records in docs/results/atlas-families",
        ),
        (["lab", "experiment", "atlas-controls", "run", "--families", "5"], "family units [5] are not in its plan"),
        (["lab", "experiment", "atlas-controls", "run", "--runs", "2"], "runs [2] are not in its plan (runs: [0, 1])"),
        (["lab", "experiment", "real-atlas", "run", "--families", "0"], "its units are seeds, not families"),
        (["lab", "experiment", "atlas-controls", "run", "--seeds", "0"], "its units are families, not seeds"),
        (["lab", "experiment", "atlas-controls", "run", "--figure", "x.png"], "atlas-controls draws no figure"),
        (["lab", "experiment", "atlas-controls", "run", "--pilot"], "atlas-controls has no pilot"),
        (["lab", "experiment", "real-atlas", "run", "--pilot", "--seeds", "0"], "--pilot runs the pilot's own seed"),
        (["lab", "experiment", "atlas", "plan", "--temperature", "1"], "--temperature: unknown option"),
        (["lab", "experiment", "atlas", "analyse", "--results", "nowhere"], "nowhere/atlas.plan.json"),
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
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def test_an_unknown_experiment_or_action_is_refused_before_torch_loads(tmp_path):
    import subprocess
    import sys

    script = (
        "import sys\nfrom kinfolk.commands import main\n"
        "codes = [main(['lab', 'experiment', 'sideways']), main(['lab', 'experiment', 'atlas', 'rerun'])]\n"
        "print(codes, [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.stdout.strip() == "[2, 2] []", done.stderr[-2000:]


def test_plan_keeps_the_same_plan_and_refuses_another(tmp_path, capsys):
    from kinfolk.commands import main

    committed = RESULTS / "atlantis.plan.json"
    (tmp_path / "atlantis.plan.json").write_bytes(committed.read_bytes())
    assert main(["lab", "experiment", "atlantis", "plan", "--results", str(tmp_path)]) == 0
    assert (tmp_path / "atlantis.plan.json").read_bytes() == committed.read_bytes()  # the same plan: kept
    digest = hashlib.sha256(committed.read_bytes()).hexdigest()
    assert capsys.readouterr().out.strip() == f"{tmp_path / 'atlantis.plan.json'}: sha256 {digest}"
    (tmp_path / "atlas.plan.json").write_bytes(committed.read_bytes())  # another experiment's plan under atlas
    assert main(["lab", "experiment", "atlas", "plan", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "atlas.plan.json exists with other content: a changed plan is a new version" in err and "\n" not in err
    assert (tmp_path / "atlas.plan.json").read_bytes() == committed.read_bytes()  # untouched
    assert main(["lab", "experiment", "real-boomerang", "plan", "--results", str(tmp_path / "new")]) == 0
    written = (tmp_path / "new" / "real-boomerang.plan.json").read_bytes()
    assert written == (RESULTS / "real-boomerang.plan.json").read_bytes()  # what the experiment plans


def test_results_page_agrees_with_its_data():
    from kinfolk.lab.demo.results_page import page_with_results

    root = Path(__file__).resolve().parents[1] / "docs"
    if not list((root / "results").glob("*.json")):
        pytest.skip("no committed results")
    text = (root / "results.md").read_text()
    assert page_with_results(text, root / "results") == text, (
        "docs/results.md's generated tables are stale: run python tools/results_page.py"
    )
