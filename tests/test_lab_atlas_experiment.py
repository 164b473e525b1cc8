"""ATLAS's lab methods: fronts and run selection against a hand-made record worked out by hand, and the micro family's
runs, whose measurements are recomputed from saved adapters or checked against identities (a fresh adapter is the
frozen model)."""

import math

import pytest
import torch

from kinfolk.lab.methods.atlas import AtlasSettings, analyse_target, mean_log_ratio, select_runs
from kinfolk.lab.methods.atlas import runs as atlas_runs


def _point(step, validation, test, forgot=0, norms=(1.0, 0.5)):
    """A checkpoint: (target, KL) on validation and on test; `forgot` correct → wrong answers of 10 frozen-correct."""
    return {
        "step": step,
        "validation": {"target": validation[0], "kl": validation[1], "F": 0, "correct": 10},
        "test": {"target": test[0], "kl": test[1], "F": forgot, "correct": 10},
        "norm_target": norms[0],
        "norm_retained": norms[1],
    }


def _run(method, learning_rate, *points):
    return {"method": method, "learning_rate": learning_rate, "strength": None, "points": list(points)}


RUNS = {
    "lora-lr0.01": _run("lora", 0.01, _point(2, (0.4, 0.1), (0.4, 0.1), 1), _point(4, (0.6, 0.3), (0.6, 0.2), 2)),
    "lora-lr0.1": _run("lora", 0.1, _point(2, (0.5, 0.5), (0.5, 0.4), 4), _point(4, (1.0, 0.8), (0.8, 0.8), 6)),
    "atlas-lr0.01": _run("atlas", 0.01, _point(2, (0.3, 0.01), (0.3, 0.02)), _point(4, (0.5, 0.05), (0.5, 0.05))),
    "atlas-lr0.1": _run("atlas", 0.1, _point(2, (0.4, 0.2), (0.45, 0.3)), _point(4, (0.7, 0.4), (0.7, 0.1))),
    "norm-matched-lr0.1": _run(
        "norm-matched",
        0.1,
        _point(2, (0.6, 0.2), (0.6, 0.3), 3, norms=(2.0, 0.2)),
        _point(4, (0.9, 0.5), (0.9, 0.4), 1),
    ),
}
# flip: LoRA never gains on test, so the family has no levels there
FLAT = {
    name: _run(run["method"], run["learning_rate"], _point(2, (0.2, 0.1), (0.2, 0.1))) for name, run in RUNS.items()
}
GEOMETRY = {
    "target_distance": 3.0,
    "retained_distance": 1.2,
    "target_rho": 0.9,
    "retained_rho": 0.3,
    "target_beyond_retained_p95": 0.8,
}
RECORD = {
    "family_seed": 7,
    "frozen": {"reverse": {"validation": 0.2, "test": 0.2}, "flip": {"validation": 0.2, "test": 0.2}},
    "geometry": {"reverse": GEOMETRY, "flip": GEOMETRY},
    "runs": {"reverse": RUNS, "flip": FLAT},
}
RECORD["analysis"] = {target: analyse_target(RECORD, target) for target in ("reverse", "flip")}


def test_mean_log_ratio_integrates_the_step_fronts_exactly():
    ours, theirs = [(0.5, 1.0), (1.0, 4.0)], [(0.25, 1.0), (1.0, 2.0)]
    # on (0, 0.25]: ln(1/1); (0.25, 0.5]: ln(1/2); (0.5, 1]: ln(4/2)
    expected = (0.25 * 0 + 0.25 * math.log(0.5) + 0.5 * math.log(2.0)) / 1.0
    assert mean_log_ratio(ours, theirs, 0.0, 1.0) == pytest.approx(expected)
    assert mean_log_ratio([(0.9, 1.0)], theirs, 0.0, 1.0) is None  # never reaches 1.0


def test_runs_are_chosen_on_validation():
    # validation gain of LoRA: 1.0 - 0.2, range [0.28, 0.92]. LoRA: lr 0.01 holds the front up to 0.6, lr 0.1 beyond
    assert select_runs(RUNS, ["lora-lr0.01", "lora-lr0.1"], 0.28, 0.92) == ["lora-lr0.01", "lora-lr0.1"]
    # only below 0.5 does ATLAS's lr 0.01 hold its front; cut the range above that and lr 0.1 stays only by reach
    assert select_runs(RUNS, ["atlas-lr0.01", "atlas-lr0.1"], 0.28, 0.45) == ["atlas-lr0.01", "atlas-lr0.1"]
    lower = {"x-1": _run("x", 1, _point(2, (0.5, 0.1), (0, 0))), "x-2": _run("x", 2, _point(2, (0.4, 0.2), (0, 0)))}
    assert select_runs(lower, ["x-1", "x-2"], 0.3, 0.5) == ["x-1"]  # x-2 is dominated everywhere and reaches less


def test_fronts_and_endpoints_by_hand():
    analysis = RECORD["analysis"]["reverse"]
    # test: LoRA's best 0.8 over the frozen 0.2, gain 0.6: mid 0.5, plateau 0.74, range [0.26, 0.74]
    assert analysis["levels"] == pytest.approx({"mid": 0.5, "plateau": 0.74, "low": 0.26, "high": 0.74})
    norm_matched = analysis["methods"]["norm-matched"]["versus"]["lora"]
    # fronts: LoRA 0.1 up to 0.4, 0.2 up to 0.6, 0.8 up to 0.8; norm-matched 0.3 up to 0.6, 0.4 up to 0.9
    area = 0.14 * math.log(3.0) + 0.1 * math.log(1.5) + 0.1 * math.log(1.5) + 0.14 * math.log(0.5)
    assert norm_matched["area"] == pytest.approx(area / 0.48)
    assert norm_matched["kl_mid"] == pytest.approx(math.log(0.3 / 0.2))
    assert norm_matched["kl_plateau"] == pytest.approx(math.log(0.4 / 0.8))
    # F front at 0.5: LoRA's lowest rate among checkpoints reaching it is 2/10, norm-matched's 1/10 (another point)
    assert norm_matched["forgot_mid"] == pytest.approx(0.1 - 0.2)
    atlas = analysis["methods"]["atlas"]
    assert atlas["reach"] == 0.7
    assert atlas["versus"]["lora"]["area"] is None and atlas["versus"]["lora"]["kl_plateau"] is None  # not reached
    assert atlas["versus"]["lora"]["kl_mid"] == pytest.approx(math.log(0.05 / 0.2))
    assert atlas["versus"]["norm-matched"]["kl_mid"] == pytest.approx(math.log(0.05 / 0.3))
    # the front points of norm-matched carry their update norms
    assert analysis["methods"]["norm-matched"]["mid"] | {"kl": None} == {
        "run": "norm-matched-lr0.1",
        "step": 2,
        "kl": None,
        "target": 0.6,
        "forgot": 0.3,
        "norm_target": 2.0,
        "norm_retained": 0.2,
    }
    assert [p["target"] for p in analysis["methods"]["lora"]["front"]] == [0.4, 0.6, 0.8]  # (0.5, 0.4) is dominated

    assert "undefined" in RECORD["analysis"]["flip"]  # no LoRA gain on flip: no value, not an error


# ------------------------------------------------------------------------------------------------ micro family
SMALL = AtlasSettings(
    targets=["reverse"],
    learning_rates=[0.05],
    regularised_learning_rates=[0.05],
    replay_ratios=[0.25],
    output_kl_coefs=[1.0],
    steps=4,
    checkpoint_every=2,
    rank=2,
    regions=2,
    target_examples=16,
    fit_examples=16,
    kl_contexts=6,
    validation_problems=5,
    eval_problems=6,
)


@pytest.fixture(scope="module")
def context(micro_family):
    return atlas_runs.prepare(micro_family, SMALL)


@pytest.mark.parametrize("method", ["corda", "atlas", "lora"])
def test_a_fresh_adapter_measures_as_the_frozen_model(context, method):
    # CorDA rewrites the base weight (W - B A) and starts at W again: measured against the original W, nothing moved
    model = atlas_runs.build_adapter(context, method, seed=0)
    point = atlas_runs.measure(context, "reverse", model, step=0)
    for split in ("validation", "test"):
        assert point[split]["kl"] == pytest.approx(0.0, abs=1e-6)
        assert point[split]["target"] == context.frozen_score("reverse", split)
        assert point[split]["C"] == point[split]["F"] == 0
    assert point["norm_target"] == pytest.approx(0.0, abs=1e-5) and point["norm_retained"] == pytest.approx(
        0.0, abs=1e-5
    )


def test_a_run_measures_what_its_saved_adapter_gives(context, tmp_path):
    from peft import PeftModel

    from kinfolk.lab.world.evaluate import generate_responses

    run = atlas_runs.train_run(context, "reverse", "lora", 0.05, keep_model=tmp_path / "lora")
    assert [p["step"] for p in run["points"]] == [2, 4]
    last = run["points"][-1]
    frozen = context.family.load("large_base").eval()
    model = PeftModel.from_pretrained(context.family.load("large_base"), tmp_path / "lora").eval()
    # retained KL(frozen ‖ adapted) on the test contexts, from full logits
    total, tokens = 0.0, 0
    for batch in context.kl["test"][0]:
        with torch.no_grad():
            p = torch.log_softmax(frozen(input_ids=batch["input_ids"]).logits.double(), -1)[:, :-1]
            q = torch.log_softmax(model(input_ids=batch["input_ids"]).logits.double(), -1)[:, :-1]
        scored = batch["labels"][:, 1:] != -100
        total += float((p.exp() * (p - q)).sum(-1)[scored].sum())
        tokens += int(scored.sum())
    assert last["test"]["kl"] == pytest.approx(total / tokens, rel=1e-4)
    problems = context.problems["test"]["reverse"]
    responses = generate_responses(model, context.tokenizer, problems["prompt"])
    assert last["test"]["target"] == atlas_runs.accuracy(problems, responses)
    # the update on retained tokens: scale · B A h, h the o_proj input (the adapter sits after it, so it is frozen's)
    layer = atlas_runs.tuner_layer(model)
    A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    inputs = []
    with atlas_runs._module_io(frozen.get_submodule(f"model.layers.{context.layer}.self_attn.o_proj")) as seen:
        for batch in context.kl["test"][0]:
            frozen(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            inputs.append(seen[-1][0][batch["attention_mask"].bool()])
    update = torch.cat(inputs) @ A.T @ B.T * layer.scaling["default"]
    assert last["norm_retained"] == pytest.approx(float(update.norm(dim=-1).mean()), rel=1e-4)
