"""The ADAPT lab experiment: one seed on a micro family whose numbers are recomputed from the saved artefacts or
checked against identities of the methods (the ATLAS experiment's tests are in test_lab_atlas_experiment.py)."""

import pytest
import torch
from safetensors.torch import load_file


@pytest.fixture(scope="module")
def micro_family(tmp_path_factory):
    from kinfolk.lab.family import LabConfig, build_family
    from tests.test_lab_family import MICRO

    return build_family(LabConfig(**MICRO), cache_dir=tmp_path_factory.mktemp("lab"), progress=False)


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
