"""The one matching rule (`kinfolk.drift.levels`) against hand computations, the places that use it (`kinfolk
compare`'s rate choice and verdicts, `kinfolk drift`'s per-level summaries), and the lab's legacy rule pinned to the
versions whose committed results it chose."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from kinfolk.compare.analysis import analyse
from kinfolk.compare.grid import RunKey
from kinfolk.drift import Run, target_matched
from kinfolk.drift.levels import gain_level, seeds_drift
from kinfolk.lab.methods import selection as lab_selection
from kinfolk.lab.protocol import EXPERIMENTS, get_experiment

REPO = Path(__file__).resolve().parents[1]
LEGACY_FUNCTIONS = {"lowest_drift", "lowest_at_level", "checkpoints_at_levels", "choose_run", "pilot_level"}


def curve(method: str, seed: int, points) -> Run:
    return Run(method, str(seed), f"{method}/{seed}", [(0, 1.0, 0.0), *points])


def test_a_level_is_a_fraction_of_the_best_rate_s_lowest_seed_best():
    # rate a: seeds best 3 and 5 (lowest 3); rate b: 4 and 4.5 (lowest 4) -> reference 4; start 1
    rate_a = [curve("lora", 0, [(5, 3.0, 0.1)]), curve("lora", 1, [(5, 5.0, 0.1)])]
    rate_b = [curve("lora", 0, [(5, 4.0, 0.1)]), curve("lora", 1, [(5, 4.5, 0.1)])]
    level = gain_level(0.25, [rate_a, rate_b])
    assert (level.start, level.reference, level.value) == (1.0, 4.0, 1.75)
    assert level.describe() == "1.75 (25% of the baseline's gain, from 1 to 4)"


def test_a_methods_drift_is_the_geometric_mean_of_first_reach_drifts():
    runs = [
        curve("atlas", 0, [(2, 2.0, 0.01), (4, 4.0, 0.04)]),  # level 3: halfway, sqrt(0.01 * 0.04) = 0.02
        curve("atlas", 1, [(2, 3.0, 0.08), (4, 2.0, 0.01)]),  # level 3 at step 2 (step 4 is below the record)
    ]
    assert seeds_drift(runs, 3.0) == pytest.approx(math.sqrt(0.02 * 0.08))
    assert seeds_drift(runs, 3.5) is None  # seed 1 never reaches it
    assert seeds_drift(runs, 1.0) == 0.0  # reached at the untouched start


def test_compare_and_drift_read_the_same_number_at_a_level():
    lora = [curve("lora", s, [(2, 2.0, 0.02 * (s + 1)), (4, 3.0, 0.08 * (s + 1))]) for s in range(2)]
    atlas = [curve("atlas", s, [(2, 2.5, 0.01 * (s + 1)), (4, 3.0, 0.02 * (s + 1))]) for s in range(2)]
    keyed = {RunKey(run.method, 1e-3, int(run.seed)): run for run in (*lora, *atlas)}
    analysis = analyse(keyed, "lora", selection_fraction=0.5, fractions=[0.5])
    level = analysis.levels[0]
    assert level.value == analysis.selection_level == 2.0  # one scale: start 1, reference 3
    (verdict,) = analysis.verdicts
    by_hand = math.sqrt(0.01 * 0.02) * 2 / 3  # atlas at 2: two thirds along the linear segment from the start
    assert verdict.drift == pytest.approx(by_hand)
    matched = target_matched([*lora, *atlas], "atlas", requirements=[level.value])
    summaries = {summary.method: summary.drift_by_requirement[0] for summary in matched.methods}
    assert summaries == pytest.approx({"atlas": verdict.drift, "lora": verdict.baseline_drift})


def test_the_lab_legacy_rule_can_choose_otherwise_than_the_one_rule():
    # LoRA's best 1 sets the level 0.5 (fraction 0.5, frozen 0); the run reaches 0.5 at step 10 (KL 0.2), overshoots
    # to 0.9 at step 20 with KL 0.1: the legacy rule takes step 20's 0.1, the one rule reads 0.2 at first reach
    points = [{"step": 0, "gain": 0.0, "kl": {"a": 0.0}}, {"step": 10, "gain": 0.5, "kl": {"a": 0.2}},
              {"step": 20, "gain": 0.9, "kl": {"a": 0.1}}, {"step": 30, "gain": 1.0, "kl": {"a": 0.3}}]  # fmt: skip
    assert lab_selection.checkpoint_at(points, 0.5) == 20
    run = Run("m", "0", "m", [(p["step"], p["gain"], p["kl"]["a"]) for p in points])
    assert seeds_drift([run], 0.5) == pytest.approx(0.2)


def legacy_users() -> set[str]:
    """The experiments (registry names) whose modules call one of the lab's legacy level-rule functions."""
    users = set()
    for name, registered in EXPERIMENTS.items():
        package = REPO / "kinfolk" / Path(*registered.target.split(":")[0].split(".")[1:-1])
        for path in package.glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                called = getattr(node, "attr", None) or (node.id if isinstance(node, ast.Name) else None)
                if called in LEGACY_FUNCTIONS:
                    users.add(name)
    return users


def test_the_legacy_rule_serves_only_the_versions_it_pins():
    assert legacy_users() == set(lab_selection.LEGACY_LEVEL_RULE)
    for name, version in lab_selection.LEGACY_LEVEL_RULE.items():
        assert get_experiment(name).version == version, f"{name}: a new version chooses by kinfolk.drift.levels"
