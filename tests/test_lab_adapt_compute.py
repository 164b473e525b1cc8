"""adapt-compute: the equal-FLOPs budget from the parameters a lab model really multiplies, the ladder's stopping rule
by hand, and one micro family through the protocol's runner: the ladder stops where validation stops improving, the
converged arm is that budget's student, and every primary recomputes by hand from the kept record; the plan fixes
every primary's claim, each naming its scope."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from lab_helpers import MICRO_ADAPT, run_micro

from kinfolk.lab.experiments.adapt_compute.experiment import AdaptCompute
from kinfolk.lab.experiments.adapt_compute.settings import ComputeSettings
from kinfolk.lab.methods.adapt.settings import ADAPT_LARGE_SHAPE
from kinfolk.lab.methods.compute import converged_budget, equal_flops_steps, multiplying_parameters
from kinfolk.lab.protocol.plan import CLAIMS_SCHEMA, load_plan
from kinfolk.lab.protocol.views import SelectionView

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("large_instruct", "large_bracket")


def test_the_equal_flops_budget_comes_from_the_weights_a_lab_model_multiplies():
    from transformers import AutoModelForCausalLM

    from kinfolk.lab.world.members import model_config
    from kinfolk.lab.world.tokenizer import build_lab_tokenizer

    tokenizer, settings = build_lab_tokenizer(), ComputeSettings()
    counted = {}
    for layers in (len(settings.blocks()), settings.teacher_layers):
        shape = ADAPT_LARGE_SHAPE | {"num_hidden_layers": layers}
        model = AutoModelForCausalLM.from_config(model_config(shape, tokenizer))
        # every weight a token's forward multiplies: the linear layers, the output head included
        counted[layers] = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        assert multiplying_parameters(model.config) == counted[layers]
    student, teacher = counted[4], counted[12]
    # a distillation step: the student's forward and backward (6 N) and the teacher's forward (2 N)
    ratio = (6 * student + 2 * teacher) / (6 * student)
    assert ratio == pytest.approx(1.992, abs=1e-3)
    assert equal_flops_steps(settings.steps, student, teacher) == round(settings.steps * ratio) == 100
    assert settings.equal_flops_steps == 100


@pytest.mark.parametrize(
    ("ladder", "expected"),
    [
        ([(50, 0.0), (100, 0.0)], (50, False)),  # no improvement at all: the first budget
        ([(50, 0.02), (100, 0.87), (150, 0.81)], (100, False)),  # the pilot's shape: 150 falls back
        ([(50, 0.5), (100, 0.504), (150, 0.9)], (50, False)),  # +0.004 is within the tolerance: stop at once
        ([(50, 0.1), (100, 0.2), (150, 0.3)], (150, True)),  # still improving when the ladder ends: its edge
    ],
)
def test_the_ladder_stops_at_the_first_budget_that_does_not_improve(ladder, expected):
    assert converged_budget(ladder, 0.005) == expected


def test_the_committed_plan_fixes_every_primarys_claim_with_its_scope():
    plan, _ = load_plan(ROOT / "docs" / "results" / "adapt-compute.plan.json")
    assert plan.schema == CLAIMS_SCHEMA and len(plan.primaries) == 4
    for endpoint in plan.primaries:
        claim = endpoint.claim
        scope = "equal training FLOPs" if endpoint.name.startswith("equal FLOPs") else "stopped improving"
        assert scope in claim.scope and "in the lab's 5 families" in claim.scope
        assert all(claim.scope in s for s in (claim.if_shown, claim.if_not_shown, claim.if_reversed))
    assert not any("depth" in endpoint.name for endpoint in plan.primaries)  # not identifiable: not asked


# ------------------------------------------------------------------------------------------------ one micro family
def micro_settings(tmp_path: Path) -> ComputeSettings:
    return ComputeSettings(
        families=[0], runs=1, layers="{every: 2, last: 1}", steps=2, batch_size=4, eval_problems=4,
        validation_problems=4, kl_examples=8, work=str(tmp_path / "work"),
        records=str(tmp_path / "records"), family_overrides=MICRO_ADAPT, equal_flops_steps=4, ce_budgets=[2, 4, 6],
    )  # fmt: skip


@pytest.fixture(scope="module")
def micro_run(lab_cache_dir, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("adapt-compute")
    experiment = AdaptCompute(micro_settings(tmp_path))
    record, results = run_micro(experiment, lab_cache_dir, tmp_path)
    return experiment, record, results, tmp_path


def test_micro_run_climbs_the_ladder_until_validation_stops_improving(micro_run):
    experiment, record, _, _ = micro_run
    selection = experiment.select(SelectionView(record))
    for variant in VARIANTS:
        rungs = [(r["steps"], r["validation"]) for r in record["ladder"][variant]]
        assert [steps for steps, _ in rungs] == [2, 4, 6][: len(rungs)] and len(rungs) >= 2
        best = rungs[0][1]  # by hand: every rung but the last beat the best before it by more than the tolerance
        for _, accuracy in rungs[1:-1]:
            assert accuracy > best + 0.005
            best = max(best, accuracy)
        stopped_early = len(rungs) < 3 or rungs[-1][1] <= best + 0.005
        chosen = selection["converged"][variant]
        assert chosen["edge"] == (not stopped_early)
        expected = max(rungs[:-1] if stopped_early else rungs, key=lambda rung: (rung[1], -rung[0]))[0]
        assert chosen["steps"] == expected
        # the converged arm is that budget's cross-entropy student, patched and measured like every other arm
        converged = record["curves"][variant]["ce-only/converged"]
        assert all([s["k"] for s in sizes] == [0, 1, 2, 3] for sizes in converged.values())
        arm_of_budget = {2: "ce-only/equal-steps", 4: "ce-only/equal-flops"}  # the arms trained at those budgets
        if expected in arm_of_budget:
            assert converged == record["curves"][variant][arm_of_budget[expected]]


def test_micro_run_primaries_recomputed_by_hand(micro_run):
    experiment, record, results, _ = micro_run
    selection = experiment.select(SelectionView(record))
    values = experiment.analyse(record, selection)

    def accuracy(variant, arm):
        curve = record["curves"][variant][arm]
        orders = [max(("back-to-front", "front-to-back"), key=lambda o, k=k: (curve[o][k]["validation"],
                      o == "back-to-front")) for k in range(len(curve["back-to-front"]))]  # fmt: skip
        assert orders == selection["orders"][variant][arm]
        return [curve[o][k]["test"]["accuracy"] for k, o in enumerate(orders)]

    def largest_fall(a):  # from k = M down: a size against the next smaller one
        return max(0.0, *(a[k] - a[k - 1] for k in range(1, len(a))))

    for comparison, arm in (("equal FLOPs", "ce-only/equal-flops"), ("converged", "ce-only/converged")):
        middle = [accuracy(v, "distilled")[1] - accuracy(v, arm)[1] for v in VARIANTS]  # k = M // 2 = 1
        value = values[f"{comparison}: middle size accuracy, distilled - ce-only"]
        assert value.value == pytest.approx(np.mean(middle))
        falls = {student: np.mean([largest_fall(accuracy(v, student)) for v in VARIANTS])
                 for student in ("distilled", arm)}  # fmt: skip
        drop = values[f"{comparison}: largest drop, ce-only - distilled"]
        assert (drop.value, drop.method, drop.baseline) == pytest.approx(
            (falls[arm] - falls["distilled"], falls["distilled"], falls[arm])
        )
    # the converged student's FLOPs against the distilled student's, from the record's parameter counts
    n_s, n_t = record["parameters"]["student"], record["parameters"]["teacher"]
    steps = [selection["converged"][v]["steps"] for v in VARIANTS]
    ratio = values["converged: training FLOPs, ce-only / distilled"].value
    assert ratio == pytest.approx(np.mean(steps) * 6 * n_s / (2 * (6 * n_s + 2 * n_t)))
    primaries = [name for name, entry in results["endpoints"].items() if entry["primary"]]
    assert primaries == [p.name for p in experiment.primaries()] and len(primaries) == 4
    assert json.loads(json.dumps(results))["endpoints"][primaries[0]]["baseline"] == "ce-only"
