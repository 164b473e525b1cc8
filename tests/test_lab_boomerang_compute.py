"""Real-boomerang version 3 on a tiny model: the equal-FLOPs budget from SmolLM2's weights counted layer by layer,
each seed's measured and validation rows apart, the ladder climbed until validation stops improving (by hand), the
arms differing only in loss and steps, and every primary recomputed here from the kept records."""

import json
from pathlib import Path

import pytest
import torch
from lab_helpers import no_training, run_recording_trainings

from kinfolk.lab.experiments.real_boomerang_compute.experiment import RealBoomerangCompute
from kinfolk.lab.experiments.real_boomerang_compute.settings import RealBoomerangComputeSettings
from kinfolk.lab.methods.adapt.size_curves import ORDERS, size_value
from kinfolk.lab.methods.compute import converged_budget, equal_flops_steps, multiplying_parameters
from kinfolk.lab.protocol.plan import CLAIMS_SCHEMA
from kinfolk.lab.protocol.views import SelectionView

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = {  # SmolLM2-135M-Instruct's config.json, the fields that size its weights
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True,
}  # fmt: skip


def test_the_equal_flops_budget_from_smollm2s_weights_counted_module_by_module():
    from transformers import AutoModelForCausalLM, LlamaConfig

    counted = {}
    for layers in (16, 30):
        config = LlamaConfig(**(SMOLLM2 | {"num_hidden_layers": layers}))
        with torch.device("meta"):  # shapes only
            model = AutoModelForCausalLM.from_config(config)
        counted[layers] = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        assert multiplying_parameters(config) == counted[layers]
    assert (counted[16], counted[30]) == (84_934_656, 134_479_872)
    assert equal_flops_steps(80, counted[16], counted[30]) == round(80 * (1 + counted[30] / (3 * counted[16]))) == 122
    assert RealBoomerangComputeSettings().equal_flops_steps == 122


@pytest.fixture(scope="module")
def micro(tiny_kit, tmp_path_factory):
    root = tmp_path_factory.mktemp("boomerang-compute")
    return RealBoomerangComputeSettings(
        model=str(tiny_kit.model_dir("llama", "large")), layers={"every": 2}, patched_blocks=2, steps=2,
        equal_flops_steps=3, ce_budgets=[2, 3, 4], batch_size=2, max_length=64, measured_rows_per_source=3,
        validation_rows_per_source=2, measured_length=96, chat_prompts=48, answer_tokens=4, seeds=[0, 1],
        work=str(root / "work"), records=str(root / "records"),
    )  # fmt: skip


@pytest.fixture(scope="module")
def trained(micro, tmp_path_factory):
    """Two micro seeds through the protocol's runner, with what each training call was given."""
    return run_recording_trainings(RealBoomerangCompute(micro), tmp_path_factory.mktemp("protocol"))


def kept(micro, seed: int) -> dict:
    return json.loads((Path(micro.records) / f"{seed}.json").read_text())


def test_measured_and_validation_rows_are_apart_and_drawn_per_seed(micro, trained):
    records = [kept(micro, seed) for seed in (0, 1)]
    assert records[0]["measured"] != records[1]["measured"]
    for record in records:
        for source, names in record["measured"].items():
            validation = record["validation"]["rows"][source]
            assert (len(names), len(validation)) == (3, 2) and not set(names) & set(validation)


def test_the_ladder_stops_where_validation_stops_improving_and_each_budget_trains_once(micro, trained):
    calls, _ = trained
    for seed in (0, 1):
        record = kept(micro, seed)
        rungs = [(r["steps"], r["nll"]) for r in record["validation"]["ladder"]]
        assert [steps for steps, _ in rungs] == [2, 3, 4][: len(rungs)] and len(rungs) >= 2
        best = rungs[0][1]  # by hand: each rung but the last lowered the best by more than the tolerance
        for _, nll in rungs[1:-1]:
            assert nll < best - 0.01
            best = nll
        assert converged_budget(rungs, 0.01, higher_is_better=False)[0] == (
            rungs[-2][0] if rungs[-1][1] >= best - 0.01 else rungs[-1][0]
        )
        mine = [c for c in calls if c["args"].seed == seed]
        trainings = sorted(c["out"] for c in mine)
        assert len(trainings) == len(set(trainings))  # a budget trained once serves every arm that needs it
        assert "distilled-2" in trainings and "ce-only-3" in trainings  # the equal-FLOPs arm's budget
        by_steps = {c["args"].max_steps: c for c in mine if c["out"].startswith("ce-only")}
        distilled = next(c for c in mine if c["out"] == "distilled-2")
        assert by_steps[2]["rows"] == distilled["rows"]  # equal steps: the same rows in the same order
        assert (by_steps[2]["args"].kl_weight, by_steps[2]["args"].cosine_weight) == (0.0, 0.0)
        read = {steps: sum(map(len, by_steps[steps]["rows"])) for steps in (2, 3)}
        assert read[3] > read[2]  # a longer budget reads more rows (here: batch 2, one more SFT step)


def test_every_primary_recomputes_from_the_kept_records(micro, trained):
    _, results = trained
    experiment = RealBoomerangCompute(micro)
    for seed in (0, 1):
        record = kept(micro, seed)
        selection = experiment.select(SelectionView(record))
        for comparison, arm in (("equal FLOPs", "ce-only/equal-flops"), ("converged", "ce-only/converged")):
            curves = {name: record["test"][name] for name in ("distilled", arm)}
            middle = {n: sum(size_value(c[o][1], "nll") for o in ORDERS) / 2 for n, c in curves.items()}
            steps = {n: sum(max(0.0, *(size_value(c[o][k - 1], "nll") - size_value(c[o][k], "nll")
                                       for k in range(1, len(c[o])))) for o in ORDERS) / 2
                     for n, c in curves.items()}  # fmt: skip
            for statistic, by_hand in (("middle size", middle), ("largest step", steps)):
                entry = results["endpoints"][f"{comparison}: {statistic} log-ppl, ce-only - distilled"]
                assert entry["per_unit"][seed] == pytest.approx(by_hand[arm] - by_hand["distilled"], abs=1e-6)
                assert entry["absolute"]["method"][seed] == pytest.approx(by_hand["distilled"], abs=1e-6)
        assert (
            record["test"]["ce-only/converged"]
            == record["test"][
                {2: "ce-only/equal-steps", 3: "ce-only/equal-flops"}.get(
                    selection["converged"]["steps"], "ce-only/converged"
                )
            ]
        )
    primaries = [name for name, entry in results["endpoints"].items() if entry["primary"]]
    assert primaries == [p.name for p in experiment.primaries()] and len(primaries) == 4
    with no_training():  # the kept records are read back, never remade
        assert experiment.load_run(0, 0) == kept(micro, 0)


def test_the_plan_fixes_each_primarys_claim_with_its_scope():
    experiment = RealBoomerangCompute()
    plan = experiment.plan(**experiment.plan_fields())
    assert plan.schema == CLAIMS_SCHEMA
    for endpoint in plan.primaries:
        claim = endpoint.claim
        assert claim.scope.startswith("on SmolLM2-135M-Instruct and its 16-layer student (5 seeds)")
        assert ("equal training FLOPs" in claim.scope) == endpoint.name.startswith("equal FLOPs")
        assert all(claim.scope in s for s in (claim.if_shown, claim.if_not_shown, claim.if_reversed))
