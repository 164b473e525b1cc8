"""`kinfolk drift` against small examples worked out by hand.

Method "atlas" (the focus) and "lora", two seeds each; checkpoints are (step, target score, retained KL), every
target above the ones before it, so every checkpoint is on its run's envelope:

    atlas/1: (1, 10, .002) (2, 12, .004) (3, 13, .003)      lora/1: (1, 10, .004) (2, 13, .010)
    atlas/2: (1, 11, .001) (2, 12, .005) (3, 14, .006)      lora/2: (1, 9, .002) (2, 12, .006) (3, 15, .008)

Shared levels: from max(10, 11, 10, 9) = 11 to min(13, 14, 13, 15) = 13, i.e. k = 11, 12, 13. Between two
checkpoints (t_a, d_a), (t_b, d_b) the drift at k is d_a^(1-f) · d_b^f with f = (k - t_a) / (t_b - t_a):

    atlas/1: √(.002·.004), .004, .003            atlas/2: .001, .005, √(.005·.006)
    lora/1:  .004^⅔·.010^⅓, .004^⅓·.010^⅔, .010   lora/2:  .002^⅓·.006^⅔, .006, .006^⅔·.008^⅓
"""

import json
import math

import numpy as np
import pytest

from kinfolk.commands import main
from kinfolk.drift import Run, load_run, markdown, parse_requirements, shared_requirements, target_matched
from kinfolk.drift.log import append_row

TARGET = "lm_eval/kinfolk_mbpp_plus_sample/pass_at_1_count"
RUNS = {
    ("atlas", "1"): [(1, 10, 0.002), (2, 12, 0.004), (3, 13, 0.003)],
    ("atlas", "2"): [(1, 11, 0.001), (2, 12, 0.005), (3, 14, 0.006)],
    ("lora", "1"): [(1, 10, 0.004), (2, 13, 0.010)],
    ("lora", "2"): [(1, 9, 0.002), (2, 12, 0.006), (3, 15, 0.008)],
}
BY_HAND = {
    ("atlas", "1"): [math.sqrt(0.002 * 0.004), 0.004, 0.003],
    ("atlas", "2"): [0.001, 0.005, math.sqrt(0.005 * 0.006)],
    ("lora", "1"): [0.004 ** (2 / 3) * 0.010 ** (1 / 3), 0.004 ** (1 / 3) * 0.010 ** (2 / 3), 0.010],
    ("lora", "2"): [0.002 ** (1 / 3) * 0.006 ** (2 / 3), 0.006, 0.006 ** (2 / 3) * 0.008 ** (1 / 3)],
}
MEANS = {key: sum(values) / 3 for key, values in BY_HAND.items()}
RATIOS = {seed: MEANS["atlas", seed] / MEANS["lora", seed] for seed in ("1", "2")}


def write_run(directory, checkpoints, target=TARGET):
    for step, score, kl in checkpoints:  # as the two callbacks write them: separate rows per step
        append_row(directory, {"step": step, "retained_kl": kl})
        append_row(directory, {"step": step, target: float(score), "checkpoint": f"checkpoint-{step}"})
    return directory


@pytest.fixture
def run_dirs(tmp_path):
    dirs = {}
    for (method, seed), checkpoints in RUNS.items():
        dirs[method, seed] = write_run(tmp_path / f"{method}-{seed}", checkpoints)
        append_row(dirs[method, seed], {"step": 99, "retained_kl": 1e-9})  # KL without a score: not a checkpoint
    return dirs


def drift_argv(runs, out, *options):
    argv = ["drift", "--method", "atlas", "--target", TARGET, "--out", str(out), "--bootstrap", "200", *options]
    for (method, seed), path in runs.items():
        argv += ["--run", method, seed, str(path)]
    return argv


def test_interpolation_and_aggregation_by_hand(run_dirs):
    runs = [load_run(method, seed, path, TARGET) for (method, seed), path in run_dirs.items()]
    assert shared_requirements(runs) == [11.0, 12.0, 13.0]
    report = target_matched(runs, "atlas", n_resamples=500)
    for run in report.runs:
        assert run.drift_by_requirement == pytest.approx(BY_HAND[run.method, run.seed])
    assert {run.seed: run.how_by_requirement for run in report.runs if run.method == "atlas"} == {
        "1": ["interpolated", "checkpoint", "checkpoint"],
        "2": ["checkpoint", "checkpoint", "interpolated"],
    }
    (lora,) = report.comparisons
    assert lora.ratio_by_seed == pytest.approx(RATIOS)
    assert lora.ratio == pytest.approx(math.sqrt(RATIOS["1"] * RATIOS["2"]))
    assert lora.interval is None and lora.bootstrap is None  # two seeds: the values are the report
    k11 = [BY_HAND["atlas", s][0] / BY_HAND["lora", s][0] for s in ("1", "2")]
    assert lora.ratio_by_requirement[0] == pytest.approx(math.sqrt(k11[0] * k11[1]))
    assert report.methods[0].mean_drift == pytest.approx(math.sqrt(MEANS["atlas", "1"] * MEANS["atlas", "2"]))
    assert report.flags == [] and report.unreached == []


def test_cli_writes_markdown_json_and_plot(run_dirs, tmp_path, capsys):
    argv = drift_argv(run_dirs, tmp_path / "report")
    assert main(argv) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    ratio = math.sqrt(RATIOS["1"] * RATIOS["2"])
    mean = math.sqrt(MEANS["lora", "1"] * MEANS["lora", "2"])
    row = (
        f"| lora | 2 | {mean:.4g} | not tested (2 seeds; an interval needs 5): {ratio:.4f} (per seed: "
        f"{RATIOS['1']:.4f}, {RATIOS['2']:.4f}) | "
        f"{100 * (1 - ratio):.2f}% |"
    )
    assert row in text
    assert "running-maximum envelope" in text and "geometrically" in text
    saved = json.loads((tmp_path / "report" / "report.json").read_text())
    assert saved["comparisons"][0]["ratio"] == pytest.approx(ratio)
    assert saved["requirements"] == [11.0, 12.0, 13.0]
    assert (tmp_path / "report" / "drift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(argv) == 2  # refuses to overwrite: bad input, one line
    assert "already exists" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0


def test_missing_keys_are_named(run_dirs):
    with pytest.raises(ValueError, match="has no target key 'lm_eval/other' in any row"):
        load_run("atlas", "1", run_dirs[("atlas", "1")], "lm_eval/other")


# --- (a) the verdict does not depend on when checkpoints were saved -------------------------------------------------


def synthetic_run(method, every, seed="1"):
    """Target 20·(1 − e^(−s/τ)) at step s (τ 8 for atlas, 12 for lora, so the two are saved at different scores);
    drift 1e-3·t² at target t for lora and half that for atlas: the true ratio is 0.5 at every target."""
    tau, scale = {"atlas": (8, 0.5), "lora": (12, 1.0)}[method]
    points = []
    for step in range(0, 41, every):
        score = 20 * (1 - math.exp(-step / tau))
        points.append((step, score, scale * 1e-3 * score**2))
    return Run(method, seed, f"{method}-every-{every}", points)


@pytest.mark.parametrize("atlas_every, lora_every", [(2, 2), (4, 4), (2, 4), (4, 2)])
def test_save_interval_does_not_change_the_verdict(atlas_every, lora_every):
    report = target_matched([synthetic_run("atlas", atlas_every), synthetic_run("lora", lora_every)], "atlas")
    (lora,) = report.comparisons
    assert lora.ratio == pytest.approx(0.5, abs=0.006)  # the true ratio, by construction
    # one level alone carries the interpolation error of the widest gap between two saves (up to 10 % here)
    assert all(ratio == pytest.approx(0.5, rel=0.1) for ratio in lora.ratio_by_requirement)
    assert min(report.requirements) > 0  # the untouched start (target 0, drift 0) sets no level


def test_same_run_saved_every_2_and_every_4_steps_gives_the_same_drift_at_shared_levels():
    """Over the levels a default would use (above the first trained save of both), the two readings agree with each
    other and with the true curve 1e-3·t² to within 7 % (the error of one gap between sparse saves); at a save both
    share, exactly."""
    dense, sparse = synthetic_run("lora", 2), synthetic_run("lora", 4)
    for level in np.linspace(shared_requirements([sparse])[0], 19.0, 9):
        truth = 1e-3 * level**2
        assert dense.drift_at(level).drift == pytest.approx(truth, rel=0.07)
        assert sparse.drift_at(level).drift == pytest.approx(truth, rel=0.07)
    shared = sparse.checkpoints[3]  # step 12, saved by both
    assert dense.drift_at(shared[1]) == sparse.drift_at(shared[1])


# --- (b) the untouched start point ------------------------------------------------------------------------------


def test_default_levels_leave_out_the_step_0_point(tmp_path, capsys):
    """Both runs measured at step 0 (target 2, drift 0), then at steps 2 and 4:
    atlas (2, 4, .01) (4, 8, .04), lora (2, 5, .03) (4, 8, .12). Levels from max(4, 5) = 5 to 8 (the start's 2 is
    not one): 5, 6, 7, 8, each read between two trained checkpoints."""
    atlas = [(0, 2, 0.0), (2, 4, 0.01), (4, 8, 0.04)]
    lora = [(0, 2, 0.0), (2, 5, 0.03), (4, 8, 0.12)]
    dirs = {("atlas", "1"): write_run(tmp_path / "atlas", atlas), ("lora", "1"): write_run(tmp_path / "lora", lora)}
    assert main(drift_argv(dirs, tmp_path / "report")) == 0
    assert "Traceback" not in capsys.readouterr().err
    saved = json.loads((tmp_path / "report" / "report.json").read_text())
    assert saved["requirements"] == [5.0, 6.0, 7.0, 8.0]
    atlas_values = [0.01**0.75 * 0.04**0.25, math.sqrt(0.01 * 0.04), 0.01**0.25 * 0.04**0.75, 0.04]
    lora_values = [0.03, 0.03 ** (2 / 3) * 0.12 ** (1 / 3), 0.03 ** (1 / 3) * 0.12 ** (2 / 3), 0.12]
    assert saved["comparisons"][0]["ratio"] == pytest.approx(sum(atlas_values) / sum(lora_values))


def test_a_run_that_never_beats_its_start_is_refused_in_one_line(tmp_path, capsys):
    dirs = {
        ("atlas", "1"): write_run(tmp_path / "atlas", [(0, 10, 0.0), (2, 8, 0.01), (4, 9, 0.02)]),
        ("lora", "1"): write_run(tmp_path / "lora", [(0, 2, 0.0), (2, 5, 0.03)]),
    }
    assert main(drift_argv(dirs, tmp_path / "report")) == 2
    assert capsys.readouterr().err == (
        "kinfolk drift: error: run atlas/1 has no checkpoint after step 0 scoring above its start (10); nothing to "
        "match\n"
    )


def test_an_explicit_level_next_to_the_start_interpolates_linearly_from_zero():
    run = Run("lora", "1", "l", [(0, 2.0, 0.0), (2, 4.0, 0.01)])
    assert run.drift_at(3.0).drift == pytest.approx(0.005) and run.drift_at(2.0).drift == 0.0
    with pytest.raises(ValueError, match="zero drift at every requirement"):
        target_matched([run, Run("atlas", "1", "a", [(0, 2.0, 0.0), (2, 4.0, 0.02)])], "atlas", requirements=[2.0])


# --- (c) a level beyond a run's reach -----------------------------------------------------------------------------


def test_levels_reached_only_by_extrapolation_are_marked_and_left_out(run_dirs, tmp_path):
    runs = [load_run(method, seed, path, TARGET) for (method, seed), path in run_dirs.items()]
    report = target_matched(runs, "atlas", requirements=parse_requirements("10:14"), n_resamples=100)
    assert report.requirements == [11.0, 12.0, 13.0]
    unreached = {entry.requirement: entry.runs for entry in report.unreached}
    assert unreached == {
        10.0: {"atlas/2": "not reached: below its first measured score 11"},
        14.0: {"atlas/1": "not reached: above its best score 13", "lora/1": "not reached: above its best score 13"},
    }
    text = markdown(report)
    assert "## Levels not reached" in text
    assert "- 14: atlas/1 not reached: above its best score 13; lora/1 not reached: above its best score 13" in text
    with pytest.raises(ValueError, match="20 is atlas/1 not reached: above its best score 13"):
        target_matched(runs, "atlas", requirements=[20.0])
    with pytest.raises(ValueError, match="'dora' has no runs"):
        target_matched(runs, "dora")


# --- (d) negative requirements ----------------------------------------------------------------------------------


@pytest.mark.parametrize("requirements", ["-0.5", "-0.6,-0.5", "-2:-1"])
def test_negative_requirements_parse_without_an_equals_sign(tmp_path, requirements):
    """Targets that are negative losses (−NLL): atlas (1, −3, .01) (2, −0.2, .04), lora the same drift doubled."""
    atlas = [(1, -3.0, 0.01), (2, -0.2, 0.04)]
    lora = [(step, score, 2 * kl) for step, score, kl in atlas]
    dirs = {("atlas", "1"): write_run(tmp_path / "atlas", atlas), ("lora", "1"): write_run(tmp_path / "lora", lora)}
    assert main(drift_argv(dirs, tmp_path / "report", "--requirements", requirements)) == 0
    saved = json.loads((tmp_path / "report" / "report.json").read_text())
    assert saved["requirements"] == parse_requirements(requirements)
    assert saved["comparisons"][0]["ratio"] == pytest.approx(0.5)


# --- (e) intervals over seeds ------------------------------------------------------------------------------------


def five_seed_runs(lora_targets=(10, 12, 14)):
    """atlas and lora, seeds 1-5; atlas/s has drift s/100 at every checkpoint, lora (s + s²/10)/50: per-seed
    ratios s / (2s + s²/5)."""
    runs = []
    for seed in range(1, 6):
        runs.append(Run("atlas", str(seed), "a", [(i + 1, t, seed / 100) for i, t in enumerate((10, 12, 14))]))
        lora_kl = (seed + seed**2 / 10) / 50
        runs.append(Run("lora", str(seed), "l", [(i + 1, t, lora_kl) for i, t in enumerate(lora_targets)]))
    return runs


def test_five_seeds_get_the_t_interval_of_the_log_ratios():
    (lora,) = target_matched(five_seed_runs(), "atlas", n_resamples=200).comparisons
    logs = np.log([s / (2 * s + s**2 / 5) for s in range(1, 6)])
    half = 2.7764451052 * logs.std(ddof=1) / math.sqrt(5)  # t(0.975, 4 degrees of freedom), from a table
    assert lora.interval.estimate == pytest.approx(math.exp(logs.mean()))
    assert (lora.interval.low, lora.interval.high) == pytest.approx(
        (math.exp(logs.mean() - half), math.exp(logs.mean() + half)), rel=1e-7
    )
    assert lora.bootstrap.low <= lora.ratio <= lora.bootstrap.high
    four = [run for run in five_seed_runs() if run.seed != "5"]
    (fewer,) = target_matched(four, "atlas", n_resamples=200).comparisons
    assert fewer.interval is None and fewer.bootstrap is None and len(fewer.ratio_by_seed) == 4


def test_a_target_that_never_moved_is_flagged():
    runs = five_seed_runs()
    runs[1] = Run("lora", "1", "l", [(i + 1, 14.0, 0.02) for i in range(3)])  # scores 14 from the first checkpoint
    report = target_matched(runs, "atlas", requirements=[14.0], n_resamples=100)
    assert report.flags == [
        "run lora/1: its target never moved (14 at every trained checkpoint), so its drift is not matched to "
        "reaching a score"
    ]
    assert "## Flags\n\n- run lora/1: its target never moved" in markdown(report)


def test_the_segment_from_the_untouched_start_is_linear_even_when_its_logged_kl_is_float_noise():
    # RetainedKLCallback's step-0 KL can come out as 2.2e-17 instead of 0: the geometric chord from it would read
    # √(2.2e-17 · 0.04) ≈ 3e-10 at the middle of the first segment
    noisy = Run("lora", "0", "l", [(0, 0.0, 2.2e-17), (4, 2.0, 0.04), (8, 4.0, 0.16)])
    assert noisy.drift_at(1.0).drift == pytest.approx(0.02)
    assert noisy.drift_at(3.0).drift == pytest.approx(math.sqrt(0.04 * 0.16))  # later segments stay geometric
