"""The ATLANTIS experiment's summary: pooled accuracies and paired differences against a hand computation."""

import pytest

from kinfolk.lab.experiment import summarise


def test_summary_pools_seeds_and_pairs_problems():
    per_seed = [
        {
            "correct": {"uniform": [1, 0, 0, 0], "oracle": [1, 1, 0, 0]},
            "diagnostics": {"ratio/token": {"spearman_true_ratio": 0.2, "ess_fraction": 0.5}},
        },
        {
            "correct": {"uniform": [0, 0, 1, 0], "oracle": [1, 1, 1, 1]},
            "diagnostics": {"ratio/token": {"spearman_true_ratio": 0.4, "ess_fraction": 0.7}},
        },
    ]
    summary = summarise(per_seed)
    assert summary["accuracy"]["uniform"]["estimate"] == pytest.approx(2 / 8)
    assert summary["accuracy"]["oracle"]["estimate"] == pytest.approx(6 / 8)
    difference = summary["difference_vs_uniform"]["oracle"]
    assert difference["estimate"] == pytest.approx(0.5)
    # every problem's difference is 0 or +1, so every resampled mean lies in [0, 1]
    assert 0.0 <= difference["low"] <= 0.5 <= difference["high"] <= 1.0
    assert "uniform" not in summary["difference_vs_uniform"]
    assert summary["diagnostics"]["ratio/token"]["spearman_true_ratio"]["estimate"] == pytest.approx(0.3)


def test_one_seed_runs_every_weighting_on_a_micro_family(tmp_path):
    from kinfolk.lab.experiment import atlantis_seed
    from kinfolk.lab.family import LabConfig, build_family
    from kinfolk.trainers.atlantis import FORMULAS, NORMALIZATIONS
    from tests.test_lab_family import MICRO

    family = build_family(LabConfig(**MICRO), cache_dir=tmp_path, progress=False)
    result = atlantis_seed(
        family,
        0,
        pool_size=16,
        steps=1,
        learning_rate=1e-3,
        normalization="token",
        temperature=1.0,
        eval_problems=3,
        progress=False,
    )
    assert set(result["correct"]) == {"uniform", "oracle", *FORMULAS}
    assert all(len(outcomes) == 2 * 3 for outcomes in result["correct"].values())  # 2 post-trained skills x 3
    assert set(result["diagnostics"]) == {f"{f}/{n}" for f in FORMULAS for n in NORMALIZATIONS}
