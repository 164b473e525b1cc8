"""ADAPT's lab methods on one micro family (4-layer teacher, a few steps of everything): the family's record
(`adapt_family`, what the demo runs) holds models that obey the methods' identities and measurements equal to
independent recomputations from the saved models."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lab_helpers import MICRO_ADAPT
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from kinfolk.lab.methods.adapt import (
    METHODS,
    AdaptFamily,
    AdaptSettings,
    adapt_family,
    adapt_family_config,
    concordance,
    format_of,
    graded_problems,
    largest_drop,
    teacher_agreement,
)
from kinfolk.lab.world.evaluate import skill_scores
from kinfolk.plugins.adapt import LayerMap
from kinfolk.plugins.adapt.cost import model_cost
from kinfolk.plugins.adapt.routing import Outcomes, frontier

SETTINGS = AdaptSettings(budgets=[2, 3], steps=2, batch_size=4, eval_problems=4, validation_problems=4,
                         kl_examples=8, routing_problems=3)  # fmt: skip


@pytest.fixture(scope="module")
def experiment(lab_cache_dir, tmp_path_factory):
    """One micro family's record (`adapt_family`), the family (built once per session) and its run's work."""
    from kinfolk.lab.world.family import build_family

    family = build_family(adapt_family_config(0, **MICRO_ADAPT), cache_dir=lab_cache_dir, progress=False)
    work = tmp_path_factory.mktemp("adapt") / "work"
    record = json.loads(json.dumps(adapt_family(family, work, SETTINGS)))  # as a kept record reads back
    return {"record": record, "family": family, "run": AdaptFamily(family, work, SETTINGS)}


def _weights(directory) -> dict[str, torch.Tensor]:
    return load_file(Path(directory) / "model.safetensors")


def test_the_family_is_the_adapt_family(experiment):
    family = experiment["family"]
    assert family.config.post_trained_skills == ["copy", "reverse", "reverse_graded"]
    assert "reverse_graded" in family.config.skill_shares
    # {every: 2, last: 1} of 4 layers: student layers 0, 2, 3; k = 0..3
    assert LayerMap.load(experiment["run"].init("large_instruct")).blocks == ((0, 2), (2, 3), (3, 4))


def test_every_size_is_a_saved_model_with_its_measurements(experiment):
    record, run = experiment["record"], experiment["run"]
    for variant in SETTINGS.variants:
        for budget in SETTINGS.budgets:
            curve = record["interpolation"][variant][str(budget)]
            assert [size["k"] for size in curve["chosen"]] == [0, 1, 2, 3]
            for k, size in enumerate(curve["chosen"]):
                others = [curve["orders"][order][k]["validation"] for order in SETTINGS.orders]
                assert size["validation"] == max(others)  # the validation-chosen order
            accuracy = [size["test"]["mean"] for size in curve["chosen"]]
            assert curve["accuracy_concordance"] == concordance(accuracy)
            assert curve["kl_concordance"] == concordance([-size["kl"] for size in curve["chosen"]])
            assert curve["largest_accuracy_drop"] == largest_drop(accuracy)
            assert curve["student_gap"] == accuracy[-1] - accuracy[0]
            # k = M is the variant itself: no KL, cosine 1 at every layer and position
            full = curve["chosen"][-1]
            assert full["kl"] == pytest.approx(0.0, abs=1e-6)
            assert np.allclose(full["cosine_per_layer"], 1.0, atol=1e-5)
            assert np.allclose(full["cosine_per_position"], 1.0, atol=1e-5)
    # a size's test accuracy is the lab evaluator's on the saved model, in the variant's format
    size = record["interpolation"]["large_bracket"]["2"]["chosen"][1]
    model = AutoModelForCausalLM.from_pretrained(size["dir"])
    scores = skill_scores(
        model, run.tokenizer, ["copy", "reverse"], SETTINGS.eval_problems, 0, format_of("large_bracket")
    )
    assert size["test"]["copy"] == scores["copy"]["accuracy"]
    assert size["test"]["mean"] == pytest.approx((scores["copy"]["accuracy"] + scores["reverse"]["accuracy"]) / 2)


def test_transfer_models_obey_the_methods_identities(experiment):
    run, steps = experiment["run"], SETTINGS.steps
    base = run.distilled("large_base", "two-phase", steps)
    distilled_base, init_base = _weights(base / "distilled"), _weights(base / "init-student")
    delta = _weights(base / "delta")
    for name, value in distilled_base.items():
        torch.testing.assert_close(delta[name], value - init_base[name], rtol=0, atol=0)
    for variant in SETTINGS.variants:
        # ADAPT (weight-delta): the variant's init + the base's delta
        transferred = _weights(run.student("weight-delta", variant, steps))
        variant_init = _weights(run.init(variant))
        for name, value in transferred.items():
            torch.testing.assert_close(value, variant_init[name] + delta[name], msg=name)
        # cross-patch at k = 0 is the distilled base student, untouched
        cross = _weights(run.sizes("cross-patch", variant, steps, "back-to-front") / "k0")
        for name, value in cross.items():
            assert torch.equal(value, distilled_base[name]), name
    curves = experiment["record"]["transfer"]["large_instruct"]["curves"]
    assert set(curves) == set(METHODS)
    # at the transfer budget the direct students are the interpolation stage's (shared, not retrained)
    assert curves["distilled"]["chosen"] == experiment["record"]["interpolation"]["large_instruct"]["2"]["chosen"]


def test_delta_cosine_is_the_cosine_of_the_flattened_deltas(experiment):
    run, record = experiment["run"], experiment["record"]
    own = _weights(run.distilled("large_bracket", "two-phase", SETTINGS.steps) / "delta")
    base = _weights(run.distilled("large_base", "sft", SETTINGS.steps) / "delta")
    a = torch.cat([base[name].double().flatten() for name in sorted(own)])
    b = torch.cat([own[name].double().flatten() for name in sorted(own)])
    expected = float(a @ b / (a.norm() * b.norm()))
    assert record["transfer"]["large_bracket"]["delta_cosine"]["sft"]["cosine"] == pytest.approx(expected)


def test_teacher_agreement_against_full_forward_passes(experiment):
    run = experiment["run"]
    directory = run.sizes("weight-delta", "large_instruct", SETTINGS.steps, "front-to-back") / "k1"
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    context = run.context("large_instruct")
    teacher = context["teacher"]
    aligned = LayerMap.load(directory).aligned_teacher_layers
    measured = teacher_agreement(model, teacher, context["batches"], aligned)

    kl_sum = kl_count = 0.0
    layer_sums, real_count = np.zeros(len(aligned)), 0
    for batch in context["batches"]:
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        with torch.no_grad():
            ours = model(**inputs, output_hidden_states=True)
            theirs = teacher(**inputs, output_hidden_states=True)
        scored = batch["labels"][:, 1:] != -100
        p = theirs.logits[:, :-1][scored].log_softmax(-1)
        q = ours.logits[:, :-1][scored].log_softmax(-1)
        kl_sum += float((p.exp() * (p - q)).sum())
        kl_count += int(scored.sum())
        real = batch["attention_mask"].bool()
        real_count += int(real.sum())
        # hidden_states[j + 1] is layer j's output, except the last entry (after the final norm)
        for j, layer in enumerate(aligned[:-1]):
            layer_sums[j] += float(F.cosine_similarity(ours.hidden_states[j + 1][real], theirs.hidden_states[layer + 1][real], dim=-1).sum())  # fmt: skip
    assert measured["kl"] == pytest.approx(kl_sum / kl_count, rel=1e-5)
    assert measured["cosine_per_layer"][:-1] == pytest.approx(list(layer_sums[:-1] / real_count), rel=1e-5)
    assert len(measured["cosine_per_position"]) == max(
        int(b["attention_mask"].sum(1).max()) for b in context["batches"]
    )


def test_routing_is_the_librarys_frontier_on_the_saved_outcomes(experiment):
    record, run = experiment["record"], experiment["run"]
    for method in ("distilled", "weight-delta"):
        entry = record["routing"][method]
        directory = run.sizes(method, "large_instruct", SETTINGS.steps, entry["order"])
        names = entry["models"]
        rows = [
            json.loads(line) for line in Path(entry["out"]).with_suffix(".outcomes.jsonl").read_text().splitlines()
        ]
        costs = {name: model_cost(directory / name) for name in names}
        splits = []
        for split in ("calibration", "test"):
            ids = list(dict.fromkeys(row["id"] for row in rows if row["split"] == split))
            cell = {(row["id"], row["model"]): row for row in rows if row["split"] == split}
            splits.append(Outcomes(
                tuple(names), [cell[i, names[0]]["level"] for i in ids],
                [[cell[i, m]["correct"] for m in names] for i in ids],
                [[costs[m].forward_parameters * cell[i, m]["tokens"] for m in names] for i in ids],
            ))  # fmt: skip
        expected = json.loads(json.dumps(frontier(*splits, thresholds=[round(t, 2) for t in np.linspace(0, 1, 51)])))
        assert {key: entry[key] for key in expected} == expected
    # each length is a level with the same number of problems in each split
    problems = graded_problems(3, 0, "test")
    assert [len(p.removeprefix("rev ").removesuffix("=")) for p in problems["prompt"]] == [2] * 3 + [3] * 3 + [
        4
    ] * 3 + [5] * 3 + [6] * 3


def test_settings_are_checked():
    with pytest.raises(ValueError, match="unknown stages"):
        AdaptSettings(stages=["interpolation", "pruning"])
    with pytest.raises(ValueError, match="routing_variant"):
        AdaptSettings(variants=["large_bracket"])
