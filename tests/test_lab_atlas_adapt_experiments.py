"""The ATLAS lab experiment: the matched comparison by hand, and one seed on a micro family whose numbers are
recomputed from the saved artefacts (ADAPT's experiment: tests/test_lab_adapt_experiment.py)."""

import pytest

from kinfolk.callbacks.drift_log import append_row
from kinfolk.lab.atlas_experiment import (
    CHURN_METRIC,
    COMPARATOR,
    FORGOT_METRIC,
    KL_METRIC,
    METHODS,
    TARGET_METRIC,
    matched_differences,
    summarise,
)


def _write_run(run_dir, checkpoints):
    for step, (target, kl, churn) in enumerate(checkpoints, start=1):
        row = {"step": step, TARGET_METRIC: target, KL_METRIC: kl, CHURN_METRIC: churn, FORGOT_METRIC: 10 * churn}
        append_row(run_dir, row)


def test_matched_differences_by_hand(tmp_path):
    # (target score, retained KL, churn) per checkpoint
    _write_run(tmp_path / "lora", [(0.1, 0.5, 0.2), (0.3, 0.8, 0.4)])
    _write_run(tmp_path / "atlas-full", [(0.2, 0.1, 0.3), (0.3, 0.3, 0.1)])
    _write_run(tmp_path / "lora+replay", [(0.0, 0.1, 0.1), (0.05, 0.2, 0.1)])  # never above the frozen score
    runs = {name: tmp_path / name for name in ("lora", "atlas-full", "lora+replay")}
    result = matched_differences(runs, frozen_score=0.05)
    # levels: every measured score above the frozen 0.05 up to the lower best (0.3): 0.1, 0.2, 0.3
    atlas = result["atlas-full"]
    assert atlas["levels"] == [0.1, 0.2, 0.3]
    # lowest KL among checkpoints reaching them: atlas 0.1, 0.1, 0.3; LoRA 0.5, 0.8, 0.8
    assert atlas["kl"]["method"] == pytest.approx(0.5 / 3) and atlas["kl"][COMPARATOR] == pytest.approx(2.1 / 3)
    assert atlas["kl"]["difference"] == pytest.approx(0.5 / 3 - 2.1 / 3)
    # lowest churn reaching them (independently of the KL): atlas 0.1, 0.1, 0.1; LoRA 0.2, 0.4, 0.4
    assert atlas["churn"]["difference"] == pytest.approx(0.1 - 1.0 / 3)
    assert atlas["forgot"]["difference"] == pytest.approx(10 * (0.1 - 1.0 / 3))
    assert result["lora+replay"] == {"levels": []}  # its best score is the frozen model's

    seeds = [{"final": {}, "matched": result}, {"final": {}, "matched": result}]
    summary = summarise(seeds)["matched"]
    assert summary["atlas-full"]["seeds_matched"] == 2
    assert summary["atlas-full"]["kl"]["difference"]["estimate"] == pytest.approx(0.5 / 3 - 2.1 / 3)
    assert summary["lora+replay"]["seeds_matched"] == 0 and summary["lora+replay"]["kl"]["difference"] is None


@pytest.fixture(scope="module")
def micro_family(tmp_path_factory):
    from kinfolk.lab.family import LabConfig, build_family
    from tests.test_lab_family import MICRO

    return build_family(LabConfig(**MICRO), cache_dir=tmp_path_factory.mktemp("lab"), progress=False)


def test_one_atlas_seed_runs_every_method_and_matches_its_artefacts(micro_family, tmp_path):
    from peft import AutoPeftModelForCausalLM

    from kinfolk.lab.atlas_experiment import DEFAULTS, atlas_seed
    from kinfolk.lab.skills import TARGET
    from kinfolk.lab.tasks import evaluate_with_lm_eval

    settings = DEFAULTS | {
        "steps": 4,
        "drift_points": 2,
        "eval_problems": 5,
        "target_examples": 32,
        "retained_examples": 32,
        "regions": 2,
        "rank": 4,
        "layer": 0,
    }
    result = atlas_seed(micro_family, 0, tmp_path, settings)
    assert list(result["final"]) == list(METHODS)
    # the comparison is a recomputation from the saved drift logs
    runs = {method: tmp_path / "seed-0" / "runs" / method for method in METHODS}
    assert result["matched"] == matched_differences(runs, result["frozen_target"])
    # the final target score is the saved adapter's, reloaded from disk
    for method in ("atlas-full", "lora+output-kl"):
        adapter = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "seed-0" / "models" / method)
        score = evaluate_with_lm_eval(adapter, micro_family.tokenizer(), [TARGET], limit=5)[TARGET]
        assert score == pytest.approx(float(result["final"][method]["target"])), method
