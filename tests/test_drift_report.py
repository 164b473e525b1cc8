"""`kinfolk drift` against a small example worked out by hand.

Method "atlas" (the focus) and "lora", two seeds each; checkpoints are (step, target score, retained KL):

    atlas/1: (1, 10, .002) (2, 12, .004) (3, 13, .003)      lora/1: (1, 10, .004) (2, 13, .010)
    atlas/2: (1, 11, .001) (2, 12, .005) (3, 14, .006)      lora/2: (1, 9, .002) (2, 12, .006) (3, 15, .008)

Shared requirements: from max(10, 11, 10, 9) = 11 to min(13, 14, 13, 15) = 13, i.e. k = 11, 12, 13.
Lowest KL reaching k:  atlas/1: .003 .003 .003 (mean .003)   atlas/2: .001 .005 .006 (mean .004)
                       lora/1:  .010 .010 .010 (mean .010)   lora/2:  .006 .006 .008 (mean .02/3)
Per-seed ratios atlas/lora: .3 and .6, geometric mean √.18 = 0.42426; reduction 57.57%.
At k = 11: ratios .3 and 1/6, geometric mean √.05 = 0.22361.
"""

import json
import math

import pytest

from kinfolk.callbacks.drift_log import append_row
from kinfolk.commands import main
from kinfolk.commands.drift_report import (
    Run,
    load_run,
    markdown,
    parse_requirements,
    shared_requirements,
    target_matched,
)

TARGET = "lm_eval/kinfolk_mbpp_plus_sample/pass_at_1_count"
RUNS = {
    ("atlas", "1"): [(1, 10, 0.002), (2, 12, 0.004), (3, 13, 0.003)],
    ("atlas", "2"): [(1, 11, 0.001), (2, 12, 0.005), (3, 14, 0.006)],
    ("lora", "1"): [(1, 10, 0.004), (2, 13, 0.010)],
    ("lora", "2"): [(1, 9, 0.002), (2, 12, 0.006), (3, 15, 0.008)],
}


@pytest.fixture
def run_dirs(tmp_path):
    dirs = {}
    for (method, seed), checkpoints in RUNS.items():
        run = tmp_path / f"{method}-{seed}"
        for step, target, kl in checkpoints:  # as the two callbacks write them: separate rows per step
            append_row(run, {"step": step, "retained_kl": kl})
            append_row(run, {"step": step, TARGET: float(target), "checkpoint": f"checkpoint-{step}"})
        append_row(run, {"step": 99, "retained_kl": 1e-9})  # KL without a score: not a usable checkpoint
        dirs[(method, seed)] = run
    return dirs


def test_selection_and_aggregation_by_hand(run_dirs):
    runs = [load_run(method, seed, path, TARGET) for (method, seed), path in run_dirs.items()]
    assert shared_requirements(runs) == [11.0, 12.0, 13.0]
    report = target_matched(runs, "atlas", n_resamples=500)
    best = {(run["method"], run["seed"]): run["best_kl"] for run in report["runs"]}
    assert best[("atlas", "1")] == pytest.approx([0.003, 0.003, 0.003])
    assert best[("atlas", "2")] == pytest.approx([0.001, 0.005, 0.006])
    assert best[("lora", "1")] == pytest.approx([0.010, 0.010, 0.010])
    assert best[("lora", "2")] == pytest.approx([0.006, 0.006, 0.008])
    lora = report["comparisons"]["lora"]
    assert lora["ratio_by_seed"] == pytest.approx({"1": 0.3, "2": 0.6})
    assert lora["ratio"]["estimate"] == pytest.approx(math.sqrt(0.18))
    assert lora["reduction"]["estimate"] == pytest.approx(1 - math.sqrt(0.18))
    # two seeds: the values are the report, no interval (the lab protocol asks for 5 units)
    assert set(lora["ratio"]) == {"estimate"} and set(lora["reduction"]) == {"estimate"}
    assert report["flags"] == []
    assert lora["ratio_by_requirement"][0] == pytest.approx(math.sqrt(0.05))
    assert report["methods"]["atlas"]["mean_kl"] == pytest.approx(math.sqrt(0.003 * 0.004))
    assert report["methods"]["lora"]["mean_kl"] == pytest.approx(math.sqrt(0.010 * 0.02 / 3))


def test_explicit_requirements_drop_unreached_ones(run_dirs):
    runs = [load_run(method, seed, path, TARGET) for (method, seed), path in run_dirs.items()]
    report = target_matched(runs, "atlas", requirements=parse_requirements("12:14"), n_resamples=100)
    assert report["requirements"] == [12.0, 13.0] and report["unreached_requirements"] == [14.0]
    with pytest.raises(ValueError, match="no requirement"):
        target_matched(runs, "atlas", requirements=[20.0])
    with pytest.raises(ValueError, match="'dora' has no runs"):
        target_matched(runs, "dora")


def test_cli_writes_markdown_json_and_plot(run_dirs, tmp_path, capsys):
    argv = ["drift", "--method", "atlas", "--target", TARGET, "--out", str(tmp_path / "report"), "--bootstrap", "200"]
    for (method, seed), path in run_dirs.items():
        argv += ["--run", method, seed, str(path)]
    assert main(argv) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| lora | 2 | 0.008165 | 0.4243 (2 seeds: 0.3000, 0.6000; no interval) | 57.57% |" in text
    assert "95% CI" not in text.split("\n\n", 2)[2]  # only the explanation above the table names one
    saved = json.loads((tmp_path / "report" / "report.json").read_text())
    assert saved["comparisons"]["lora"]["ratio"]["estimate"] == pytest.approx(math.sqrt(0.18))
    assert (tmp_path / "report" / "drift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(argv) == 2  # refuses to overwrite: bad input, one line
    assert "already exists" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0


def test_missing_keys_are_named(run_dirs):
    with pytest.raises(ValueError, match="no step with both 'lm_eval/other'"):
        load_run("atlas", "1", run_dirs[("atlas", "1")], "lm_eval/other")


def five_seed_runs(lora_targets=(10, 12, 14)):
    """atlas and lora, seeds 1-5; atlas/s reaches every target with KL s/100, lora with 2·s/100 (ratio 1/2)."""
    runs = []
    for seed in range(1, 6):
        runs.append(Run("atlas", str(seed), "a", [(i, t, seed / 100) for i, t in enumerate((10, 12, 14))]))
        runs.append(Run("lora", str(seed), "l", [(i, t, 2 * seed / 100) for i, t in enumerate(lora_targets)]))
    return runs


def test_five_seeds_get_a_bootstrap_interval_fewer_get_their_values():
    report = target_matched(five_seed_runs(), "atlas", n_resamples=200)
    lora = report["comparisons"]["lora"]
    assert lora["ratio"]["estimate"] == pytest.approx(0.5)
    assert lora["ratio"]["low"] == pytest.approx(0.5) and lora["ratio"]["high"] == pytest.approx(0.5)
    four = [run for run in five_seed_runs() if run.seed != "5"]
    assert set(target_matched(four, "atlas", n_resamples=200)["comparisons"]["lora"]["ratio"]) == {"estimate"}


def test_a_target_that_never_moved_is_flagged():
    runs = five_seed_runs(lora_targets=(10, 12, 14))
    runs[1] = Run("lora", "1", "l", [(i, 14.0, 0.02) for i in range(3)])  # scores 14 from the first checkpoint
    report = target_matched(runs, "atlas", requirements=[10.0, 12.0, 14.0], n_resamples=100)
    assert report["flags"] == [
        "run lora/1: its target never moved (14 at every checkpoint), so its KL is not matched to reaching a score"
    ]
    assert "## Flags\n\n- run lora/1: its target never moved" in markdown(report, TARGET, "retained_kl")
