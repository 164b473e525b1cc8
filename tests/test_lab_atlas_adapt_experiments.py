"""The ATLAS and ADAPT lab experiments: the matched comparison by hand, and one seed of each on a micro family whose
numbers are recomputed from the saved artefacts or checked against identities of the methods."""

import pytest
import torch
from safetensors.torch import load_file

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


def test_one_adapt_seed_obeys_the_transfer_identities(micro_family, tmp_path):
    from kinfolk.lab.adapt_experiment import DEFAULTS, adapt_seed, measure
    from kinfolk.lab.adapt_experiment import summarise as summarise_adapt

    settings = DEFAULTS | {"distil_steps": 2, "eval_problems": 3, "kl_examples": 8}
    result = adapt_seed(micro_family, 0, tmp_path, settings)
    root = tmp_path / "seed-0" / "adapt"
    for name, entry in result["variants"].items():
        smallest, full = entry["sizes"][0], entry["sizes"][-1]
        # k = 0 is the delta transfer: θ_variant_init + (θ_distilled − θ_init), tensor by tensor
        transferred = load_file(root / f"family-{name}" / "k0" / "model.safetensors")
        variant_init = load_file(root / f"init-{name}" / "model.safetensors")
        base_init = load_file(root / "init-base" / "model.safetensors")
        distilled = load_file(root / "distilled-base" / "model.safetensors")
        for key, value in transferred.items():
            expected = variant_init[key] + (distilled[key] - base_init[key])
            torch.testing.assert_close(value, expected, msg=key)
        # the cross-patch baseline's k = 0 is the distilled base student itself, no delta
        cross = load_file(root / f"cross-{name}" / "k0" / "model.safetensors")
        assert cross.keys() == distilled.keys()
        for key, value in cross.items():
            torch.testing.assert_close(value, distilled[key], rtol=0, atol=0, msg=key)
        # both patchings at full size are the variant teacher: zero KL, the teacher's scores
        assert full["transfer"]["teacher_kl"] == pytest.approx(0.0, abs=1e-6)
        assert full["cross_patch"]["teacher_kl"] == pytest.approx(0.0, abs=1e-6)
        assert "direct" not in full
        context = _measure_context(micro_family, name, entry, settings)
        teacher = measure(micro_family.variants[name], **context)
        assert full["transfer"]["scores"] == teacher["scores"] == full["cross_patch"]["scores"]
        # the k = 0 cross-patch's numbers are recomputed from its saved weights
        assert measure(root / f"cross-{name}" / "k0", **context)["scores"] == smallest["cross_patch"]["scores"]
        # the direct student's numbers are recomputed from its saved weights
        direct = smallest["direct"]
        again = measure(direct["path"], **context)
        assert again["scores"] == direct["scores"]
        assert again["teacher_kl"] == pytest.approx(direct["teacher_kl"])

    # the summary's differences are per-seed transfer − baseline; with one seed repeated, the plain difference
    summary = summarise_adapt([result, result])
    for name, entry in result["variants"].items():
        smallest = entry["sizes"][0]
        for baseline in ("cross_patch", "direct"):
            difference = summary[name][0]["accuracy"][f"transfer - {baseline}"]["estimate"]
            assert difference == pytest.approx(smallest["transfer"]["accuracy"] - smallest[baseline]["accuracy"])
        assert "direct" not in summary[name][-1]["accuracy"]


def _measure_context(family, name, entry, settings):
    from transformers import AutoModelForCausalLM

    from kinfolk.callbacks.retained_kl import retained_batches

    teacher = AutoModelForCausalLM.from_pretrained(family.variants[name])
    data = family.instruct_data(settings["kl_examples"], format_index=entry["format_index"])
    return {
        "teacher": teacher,
        "batches": retained_batches(data, family.tokenizer()),
        "family": family,
        "eval_problems": settings["eval_problems"],
        "seed": 0,
        "format_index": entry["format_index"],
    }
