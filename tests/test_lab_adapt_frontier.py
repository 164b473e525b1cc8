"""adapt-frontier: the random-mix frontier against a hand-computed example and a brute force over pairs of sizes, the
routing threshold's grid extended until the choice is interior, the plan's student patching back through distinct
depths, and one micro family through the protocol's runner: the ce-only student's training config differs from the
distilled one's only in the two distillation weights, the format arm's SFT rows are the same problems in
large_bracket's format, the concordance counts pairs of distinct depth only, and every primary recomputes by hand
from the kept record."""

import itertools
import random
from pathlib import Path

import numpy as np
import pytest
from lab_helpers import MICRO_ADAPT, run_micro

from kinfolk.lab.experiments.adapt_frontier.experiment import AdaptFrontier
from kinfolk.lab.experiments.adapt_frontier.runs import AdaptFrontierRuns
from kinfolk.lab.experiments.adapt_frontier.settings import FrontierSettings
from kinfolk.lab.methods.adapt.settings import BASE
from kinfolk.lab.methods.selection import frontier_threshold, mix_frontier
from kinfolk.lab.protocol.views import SelectionView
from kinfolk.lab.world.skills import FORMATS

VARIANTS = ("large_instruct", "large_bracket")


def best_mix_by_brute_force(points, cost):
    """Over every size and every pair of sizes: the best accuracy a random mix reaches at expected cost <= `cost`
    (a pair (a, b) with c_a <= cost < c_b reaches, at most, the share of b that spends `cost` exactly)."""
    reachable = [accuracy for c, accuracy in points if c <= cost]
    for (ca, aa), (cb, ab) in itertools.permutations(points, 2):
        if ca <= cost < cb:
            reachable.append(aa + (cost - ca) / (cb - ca) * (ab - aa))
    return max(reachable, default=None)


def test_mix_frontier_by_hand():
    # s (1, 0.2), m (2, 0.5), l (4, 0.8), and two sizes no mix needs: u (3, 0.6) under the m-l segment (0.65 at 3)
    # and x (5, 0.7), dearer and worse than l
    points = [(1, 0.2), (2, 0.5), (3, 0.6), (4, 0.8), (5, 0.7)]
    assert mix_frontier(points, 0.99) is None  # no mix costs less than the cheapest size
    assert mix_frontier(points, 1) == pytest.approx(0.2)
    assert mix_frontier(points, 1.5) == pytest.approx(0.35)  # half s, half m
    assert mix_frontier(points, 3) == pytest.approx(0.65)  # half m, half l: above u itself
    assert mix_frontier(points, 4.5) == pytest.approx(0.8)  # l: no mix with x is better at no more cost
    assert mix_frontier(points, 9) == pytest.approx(0.8)


def test_mix_frontier_is_the_best_mix_of_two_sizes_on_random_families():
    rng = random.Random(0)
    for _ in range(200):
        points = [(rng.randint(1, 8), rng.randint(0, 10) / 10) for _ in range(rng.randint(1, 6))]
        for cost in np.linspace(0.5, 9, 35):
            expected = best_mix_by_brute_force(points, float(cost))
            got = mix_frontier(points, float(cost))
            assert (got is None) if expected is None else got == pytest.approx(expected), (points, cost)


def calibration_routing(candidates):
    """A routing record over models A, B, C (cost 1, 2, 3) on two equally shared levels: the fixed sizes' calibration
    points are A (1, 0), B (2, 0.5), C (3, 1), so the frontier is (cost - 1) / 2. `candidates`: (assignment of the
    two levels, the thresholds that give it)."""
    return {
        "models": ["A", "B", "C"],
        "levels": [1, 2],
        "calibration": {"accuracy": [[0, 1, 1], [0, 0, 1]], "cost": [[1, 2, 3], [1, 2, 3]], "share": [0.5, 0.5]},
        "candidates": [{"assignment": dict(zip(("1", "2"), a)), "thresholds": t} for a, t in candidates],
    }


def test_threshold_choice_by_hand_and_its_grid_extended_until_interior():
    # calibration gains over the frontier: AB (cost 1.5, accuracy 0) -0.25; AA, BB, CC 0; BC (2.5, 1) +0.25
    interior = calibration_routing([("AA", [-0.5, -0.25, 0.0]), ("BB", [0.25, 0.5]), ("BC", [0.75]),
                                    ("CC", [1.0, 1.25, 1.5])])  # fmt: skip
    assert frontier_threshold(interior, 0.25, 2) == {"index": 2, "grid": [0.0, 1.0], "edge": False}
    # the best of [0, 1] is CC at its end 1.0; one step more reaches BC (better), whose 1.25 is the end then; one
    # more step (BB) does not beat it, and 1.5 is not BC's: interior
    extended = calibration_routing([("AB", [-0.5, -0.25, 0.0, 0.25, 0.5, 0.75]), ("CC", [1.0]), ("BC", [1.25]),
                                    ("BB", [1.5])])  # fmt: skip
    assert frontier_threshold(extended, 0.25, 2) == {"index": 2, "grid": [0.0, 1.5], "edge": False}
    assert frontier_threshold(extended, 0.25, 0) == {"index": 1, "grid": [0.0, 1.0], "edge": True}  # no extension
    # ties (AA, BB, CC all 0): the cheapest, AA, at the low end: extended to the bound and still there
    stuck = calibration_routing([("AA", [-0.5, -0.25, 0.0]), ("BB", [0.25, 0.5, 0.75]), ("CC", [1.0, 1.25, 1.5])])
    assert frontier_threshold(stuck, 0.25, 2) == {"index": 0, "grid": [-0.5, 1.0], "edge": True}


def test_the_plans_student_patches_back_through_sizes_of_distinct_depth():
    settings = FrontierSettings()
    blocks = settings.blocks()
    assert (
        blocks == [(0, 3), (3, 6), (6, 9), (9, 12)]
        and settings.family_config(0).large_shape["num_hidden_layers"] == 12
    )
    for order in (blocks, blocks[::-1]):  # front to back, back to front: a size replaces its blocks' student layers
        depths = [len(blocks) + sum(end - start - 1 for start, end in order[:k]) for k in range(len(blocks) + 1)]
        assert depths == [4, 6, 8, 10, 12]
    assert settings.depths() == [4, 6, 8, 10, 12]


# ------------------------------------------------------------------------------------------------ one micro family
def micro_settings(tmp_path: Path) -> FrontierSettings:
    return FrontierSettings(
        families=[0], runs=1, layers="{every: 2, last: 1}", steps=2, batch_size=4, eval_problems=4,
        validation_problems=4, kl_examples=8, routing_problems=3, work=str(tmp_path / "work"),
        records=str(tmp_path / "records"), family_overrides=MICRO_ADAPT,
    )  # fmt: skip


@pytest.fixture(scope="module")
def micro_run(lab_cache_dir, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("adapt-frontier")
    experiment = AdaptFrontier(micro_settings(tmp_path))
    record, results = run_micro(experiment, lab_cache_dir, tmp_path)
    return experiment, record, results, tmp_path


@pytest.fixture(scope="module")
def micro_arms(micro_run, lab_cache_dir):
    experiment, _, _, tmp_path = micro_run
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KINFOLK_LAB_CACHE", str(lab_cache_dir))
        runs = AdaptFrontierRuns(experiment.settings)
        return runs.arms(runs.family(0), 0, tmp_path / "work" / "0" / "run0")


def test_micro_run_measures_every_method_at_every_size(micro_run):
    _, record, _, _ = micro_run
    methods = {"distilled", "ce-only", "weight-delta", "cross-patch", "weight-delta/bracket-sft",
               "cross-patch/bracket-sft"}  # fmt: skip
    for variant in VARIANTS:
        assert set(record["curves"][variant]) == methods
        for method, orders in record["curves"][variant].items():
            for order, sizes in orders.items():
                assert [s["k"] for s in sizes] == [0, 1, 2, 3], (variant, method, order)  # blocks [0,2) [2,3) [3,4)
                assert sizes[-1]["test"]["kl"] == pytest.approx(0.0, abs=1e-6)  # k = M is the variant itself
    assert record["blocks"] == [[0, 2], [2, 3], [3, 4]] and record["teacher_layers"] == 4
    depths = {
        order: [s["layers"] for s in sizes] for order, sizes in record["curves"][VARIANTS[0]]["distilled"].items()
    }
    assert depths == {"front-to-back": [3, 4, 4, 4], "back-to-front": [3, 3, 3, 4]}  # equal depths: micro's blocks


def test_the_ce_only_students_config_differs_only_in_the_two_weights(micro_arms, micro_run, tmp_path):
    family = micro_arms["preferred-sft"]
    distilled, ce_only = (family.distillation_config(tmp_path, 2, loss).to_dict() for loss in ("distilled", "ce-only"))
    differing = {key for key in distilled if distilled[key] != ce_only[key]}
    assert differing == {"kl_weight", "cosine_weight"}
    assert (ce_only["kl_weight"], ce_only["cosine_weight"]) == (0.0, 0.0)
    assert distilled["kl_weight"] > 0 and distilled["cosine_weight"] != 0.0  # the trainer's defaults: ADAPT's loss
    # and the run trained both students: their weights differ
    students = {loss: family.student(loss, VARIANTS[0], 2) for loss in ("distilled", "ce-only")}
    assert students["distilled"] != students["ce-only"]
    from safetensors.torch import load_file

    weights = [load_file(path / "model.safetensors") for path in students.values()]
    assert any(not np.allclose(weights[0][name], weights[1][name]) for name in weights[0])


def test_the_format_arms_sft_rows_are_the_same_problems_in_large_brackets_format(micro_arms, micro_run):
    _, record, _, _ = micro_run
    preferred, bracket = (
        micro_arms[arm].training_data(BASE, "two-phase", 2)[1] for arm in ("preferred-sft", "bracket-sft")
    )
    assert len(preferred) == len(bracket) > 0 and preferred["prompt"] == bracket["prompt"]
    assert bracket["completion"] == [FORMATS[2].format(answer) for answer in preferred["completion"]]
    assert all(c.startswith("[") and c.endswith("]") for c in bracket["completion"])
    corpora = record["base_sft"]
    assert corpora["same_prompts"] and {a: c["format"] for a, c in corpora["arms"].items()} == {
        "preferred-sft": 0,
        "bracket-sft": 2,
    }
    for arm in corpora["arms"].values():
        assert set(arm["shared_prompts"].values()) == {0.0}  # disjoint from both variants' post-training rows


def concordance_by_hand(sizes, measure, higher_is_better):
    scores = []
    for a, b in itertools.combinations(sizes, 2):
        if a["layers"] == b["layers"]:
            continue
        deep, shallow = (a, b) if a["layers"] > b["layers"] else (b, a)
        d, s = deep["test"][measure], shallow["test"][measure]
        better = d > s if higher_is_better else d < s
        scores.append(1.0 if better else 0.5 if d == s else 0.0)
    return np.mean(scores) if scores else None


def test_the_concordance_counts_pairs_of_distinct_depth_only(micro_run):
    experiment, record, _, _ = micro_run
    selection = experiment.select(SelectionView(record))
    # sizes k = 0, 1, 2 of depths 3, 4, 3: of the three pairs, (k = 0, k = 2) has one depth and is left out
    mixed = ["back-to-front", "front-to-back", "back-to-front", "back-to-front"]
    selection["orders"] = {v: {m: mixed for m in methods} for v, methods in selection["orders"].items()}
    values = experiment.analyse(record, selection)
    by_hand = []
    for variant in VARIANTS:
        sizes = [record["curves"][variant]["distilled"][order][k] for k, order in enumerate(mixed)][:-1]
        assert [s["layers"] for s in sizes] == [3, 4, 3]
        kl = [s["test"]["kl"] for s in sizes]  # the pairs counted: (k = 0, k = 1) and (k = 1, k = 2), k = 1 deeper
        by_hand.append(np.mean([1.0 if kl[1] < kl[i] else 0.5 if kl[1] == kl[i] else 0.0 for i in (0, 2)]))
    assert values["depth: KL concordance over distinct depths"].value == pytest.approx(np.mean(by_hand))


def calibration_gain(routing, candidate):
    """A routed candidate's calibration accuracy minus the brute-force frontier of the fixed sizes at its cost."""
    accuracy, cost = np.asarray(routing["calibration"]["accuracy"]), np.asarray(routing["calibration"]["cost"])
    fixed = list(zip(cost.mean(axis=0), accuracy.mean(axis=0)))  # equally many problems per level
    picks = [routing["models"].index(candidate["assignment"][str(level)]) for level in routing["levels"]]
    routed_cost = np.mean([cost[i, j] for i, j in enumerate(picks)])
    frontier = best_mix_by_brute_force(fixed, routed_cost)
    return -np.inf if frontier is None else np.mean([accuracy[i, j] for i, j in enumerate(picks)]) - frontier


def test_micro_run_choices_and_primaries_recomputed_by_hand(micro_run):
    experiment, record, results, _ = micro_run
    selection = experiment.select(SelectionView(record))
    values = experiment.analyse(record, selection)

    def curve(variant, method):
        orders = selection["orders"][variant][method]
        return [record["curves"][variant][method][o][k] for k, o in enumerate(orders)]

    def accuracy(variant, method):
        return [s["test"]["accuracy"] for s in curve(variant, method)]

    for variant, methods in record["curves"].items():
        for method, orders in methods.items():
            for k, order in enumerate(selection["orders"][variant][method]):
                other = "front-to-back" if order == "back-to-front" else "back-to-front"
                mine, theirs = orders[order][k]["validation"], orders[other][k]["validation"]
                assert mine > theirs or (mine == theirs and order == "back-to-front")
    # routing: the chosen candidate has the best calibration gain over the frontier among those the final grid
    # reaches, and its test value is routed minus the brute-force frontier at its test cost
    for method in ("distilled", "weight-delta"):
        routing, chosen = record["routing"][method], selection["routing"][method]
        low, high = chosen["grid"]
        reachable = [c for c in routing["candidates"] if any(low - 1e-9 <= t <= high + 1e-9 for t in c["thresholds"])]
        gain = [
            calibration_gain(routing, candidate) for candidate in (routing["candidates"][chosen["index"]], *reachable)
        ]
        assert gain[0] == pytest.approx(max(gain[1:]))
        assert -0.1 - 1e-9 <= low <= 0 and 1 <= high <= 1.1 + 1e-9
        routed = routing["test"]["routed"][chosen["index"]]
        test_fixed = [(f["cost"], f["accuracy"]) for f in routing["test"]["fixed"].values()]
        frontier = best_mix_by_brute_force(test_fixed, routed["cost"])
        value = values[f"routing/{method}: routed - random-mix frontier"]
        assert (value.method, value.grid_edge) == (routed["accuracy"], chosen["edge"])
        assert value.value == (None if frontier is None else pytest.approx(routed["accuracy"] - frontier))
    # depth concordance (distilled, k < M, distinct depths)
    by_hand = [concordance_by_hand(curve(v, "distilled")[:-1], "accuracy", True) for v in VARIANTS]
    value = values["depth: accuracy concordance over distinct depths"].value
    assert (value is None) if None in by_hand else value == pytest.approx(np.mean(by_hand))
    # distilled against ce-only: the middle size k = M // 2 = 1 and the largest fall to the next smaller size
    middle = [accuracy(v, "distilled")[1] - accuracy(v, "ce-only")[1] for v in VARIANTS]
    assert values["distillation: middle size accuracy, distilled - ce-only"].value == pytest.approx(np.mean(middle))

    def largest_fall(a):
        return max(0.0, *(a[k] - a[k - 1] for k in range(1, len(a))))

    drops = {
        student: np.mean([largest_fall(accuracy(v, student)) for v in VARIANTS])
        for student in ("distilled", "ce-only")
    }
    drop = values["distillation: largest drop, ce-only - distilled"]
    assert (drop.value, drop.method, drop.baseline) == pytest.approx(
        (drops["ce-only"] - drops["distilled"], drops["distilled"], drops["ce-only"])
    )
    # the format arm: the split's change, with the absolute splits beside it

    def gap(variant, suffix):
        return np.mean(accuracy(variant, f"weight-delta{suffix}")[:-1]) - np.mean(
            accuracy(variant, f"cross-patch{suffix}")[:-1]
        )

    split = {s: gap("large_instruct", s) - gap("large_bracket", s) for s in ("", "/bracket-sft")}
    fmt = values["format: transfer split, bracket-sft - preferred-sft"]
    assert (fmt.value, fmt.method, fmt.baseline) == pytest.approx(
        (split["/bracket-sft"] - split[""], split["/bracket-sft"], split[""])
    )
    primaries = {name for name, e in results["endpoints"].items() if e["primary"]}
    assert primaries == {p.name for p in experiment.primaries()} and len(primaries) == 6
    for name, entry in results["endpoints"].items():  # every concordance is bounded to [0, 1], and says so
        assert (entry.get("range") == [0.0, 1.0]) == ("concordance" in name), name
