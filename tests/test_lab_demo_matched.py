"""The demo's ATLAS-vs-LoRA comparison reads each run's KL off its own curve, so when checkpoints were saved does not
decide it, and it says when the rise fell between two measurements."""

import math
from itertools import pairwise

import pytest

from kinfolk.callbacks.schedule import geometric_steps
from kinfolk.lab.demo.report import DRAWN_RISE, largest_rise_share, target_matched_text

LEVELS = {"mid": 0.5, "plateau": 0.9}


def demo_atlas_results(every: int, steps: int = 20) -> dict:
    """Both runs' score rises linearly, step / steps; retained KL grows as exp(4 · score) from 0.01 (LoRA) and
    0.002 (ATLAS), 0 at the untouched start: along such curves the geometric interpolation is exact, so ATLAS / LoRA
    is 0.2 at every level whatever the save interval."""
    saved = range(0, steps + 1, every)
    curves = {"lora": 0.01, "atlas": 0.002}
    return {
        "skills": {"target": "reverse"},
        "config": {"seed": 0},
        "atlas": {
            "retained_kl": {m: [[s, 0.0 if s == 0 else a * math.exp(4 * s / steps)] for s in saved] for m, a in curves.items()},
            "target_curve": {m: [[s, s / steps] for s in saved] for m in curves},
            "analysis": {"methods": {}, "levels": LEVELS, "frozen": 0.0, "lora_best": 1.0},
        },
    }  # fmt: skip


def test_the_verdict_is_the_same_whether_saved_every_2_or_every_4_steps():
    often, rarely = target_matched_text(demo_atlas_results(2)), target_matched_text(demo_atlas_results(4))
    for level in LEVELS.values():
        lora, atlas = 0.01 * math.exp(4 * level), 0.002 * math.exp(4 * level)
        expected = f"0.200 at reverse {level:.2f} ({atlas:.4f} vs {lora:.4f})"
        assert expected in often and expected in rarely
    assert "measured at steps 0, 2, 4 ... 20 (11)" in often and "measured at steps 0, 4, 8 ... 20 (6)" in rarely
    assert "Not drawn" not in often + rarely


def test_a_rise_between_two_measurements_is_flagged_in_both_forms():
    """Saved only at the start and the end (the old demo's 0.06 -> 1.00), the skill is learned between two
    measurements: the comparison says so, the headline's short form too."""
    results = demo_atlas_results(20)
    assert "Not drawn: atlas, lora learned reverse between two measurements" in target_matched_text(results)
    assert target_matched_text(results, short=True).endswith("the rise is not drawn: too few checkpoints")


def test_a_level_a_run_does_not_reach_is_named_never_extrapolated():
    results = demo_atlas_results(2)
    results["atlas"]["target_curve"]["atlas"] = [[s, min(s / 20, 0.6)] for s in range(0, 21, 2)]
    text = target_matched_text(results, short=True)
    assert "ATLAS not reached: above its best score 0.6 at reverse 0.90" in text
    assert f"0.200 at reverse 0.50 ({0.002 * math.exp(2):.4f} vs {0.01 * math.exp(2):.4f})" in text


@pytest.mark.parametrize(
    ("scores", "share"),
    [([0.0, 0.06, 1.0], 0.94), ([0.0, 0.25, 0.5, 0.75, 1.0], 0.25), ([0.2, 0.2, 0.2], 0.0), ([0.0, 1.0, 0.5], 1.0)],
)
def test_largest_rise_share_by_hand(scores, share):
    from kinfolk.drift.matching import Run

    run = Run("lora", "0", "", [(step, score, 0.0) for step, score in enumerate(scores)])
    assert largest_rise_share(run) == pytest.approx(share)
    assert (largest_rise_share(run) > DRAWN_RISE) == (share > 0.5)


@pytest.mark.parametrize(("steps", "points"), [(600, 40), (600, 12), (40, 8), (5, 8), (1, 3), (1000, 2)])
def test_measured_steps_run_from_1_to_the_last_step_with_gaps_that_never_shrink(steps, points):
    chosen = geometric_steps(steps, points)
    assert chosen[0] == 1 and chosen[-1] == steps and len(chosen) == min(points, steps)
    gaps = [b - a for a, b in pairwise(chosen)]
    assert all(gap >= 1 for gap in gaps) and gaps == sorted(gaps)  # dense where a fast rise would be, then wider
