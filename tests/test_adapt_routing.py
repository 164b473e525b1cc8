"""Adaptive size routing (ADAPT §4.4): the policies against hand-worked tables and a brute-force search, the
measured frontier, cost figures against the loaded models, one-pass difficulty ratings against unpadded passes,
and `kinfolk route` end to end."""

import itertools
import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from kinfolk.commands import main as kinfolk_main
from kinfolk.errors import InputError
from kinfolk.plugins.adapt.cost import model_cost
from kinfolk.plugins.adapt.difficulty import label_tokens, rate_difficulty
from kinfolk.plugins.adapt.routing import (
    LevelTable,
    Outcomes,
    data_thresholds,
    frontier,
    measure,
    route_average,
    route_minimum,
)

MODELS = ("s", "m", "l")
# levels 1..3 (rows) × models s, m, l (columns); costs 1, 2, 4 per example at every level
ACCURACY = np.array([[0.9, 1.0, 1.0], [0.5, 0.8, 1.0], [0.1, 0.4, 0.7]])
COST = np.tile([1.0, 2.0, 4.0], (3, 1))


def _table(share=(0.5, 0.3, 0.2)) -> LevelTable:
    return LevelTable((1, 2, 3), MODELS, ACCURACY, COST, np.asarray(share))


@pytest.mark.parametrize(
    "threshold, expected",
    [
        (0.0, {1: "s", 2: "s", 3: "s"}),
        (0.8, {1: "s", 2: "m", 3: "l"}),  # level 3 never reaches 0.8: its most accurate model
        (0.95, {1: "m", 2: "l", 3: "l"}),
        (0.5, {1: "s", 2: "s", 3: "l"}),
    ],
)
def test_minimum_policy_by_hand(threshold, expected):
    assert route_minimum(_table(), threshold) == expected


def test_average_policy_by_hand():
    # all small: 0.5·0.9 + 0.3·0.5 + 0.2·0.1 = 0.62 at cost 1
    assert route_average(_table(), 0.6) == {1: "s", 2: "s", 3: "s"}
    # 0.7: cheapest raise is level 2 to m (+0.09 for +0.3 cost): 0.71 at 1.3
    assert route_average(_table(), 0.7) == {1: "s", 2: "m", 3: "s"}
    # 0.9 needs +0.28 over 0.62: level 2 to l and 3 to l give +0.27, so level 1 to m as well (+0.05): 0.94 at 3.0
    assert route_average(_table(), 0.9) == {1: "m", 2: "l", 3: "l"}
    # out of reach: the most accurate assignment, then the cheapest of those (level 1: m and l tie at 1.0)
    assert route_average(_table(), 0.99) == {1: "m", 2: "l", 3: "l"}


def _brute_force(table: LevelTable, threshold: float):
    """Every assignment, no pruning: the cheapest reaching the threshold (then the most accurate); else the most
    accurate (then the cheapest). Returns (accuracy, cost) of the best."""
    best = None
    for choice in itertools.product(range(len(table.models)), repeat=len(table.levels)):
        accuracy = sum(table.share[i] * table.accuracy[i, m] for i, m in enumerate(choice))
        cost = sum(table.share[i] * table.cost[i, m] for i, m in enumerate(choice))
        key = (0, cost, -accuracy) if accuracy >= threshold - 1e-12 else (1, -accuracy, cost)
        best = min(best or (key, accuracy, cost), (key, accuracy, cost))
    return best[1], best[2]


def test_average_policy_is_the_brute_force_optimum_on_random_tables():
    rng = np.random.default_rng(0)
    for _ in range(40):
        levels, models = rng.integers(2, 5), rng.integers(2, 5)
        accuracy = rng.integers(0, 6, size=(levels, models)) / 5  # ties on purpose
        cost = np.sort(rng.integers(1, 5, size=(levels, models)), axis=1).astype(float)
        share = rng.dirichlet(np.ones(levels))
        table = LevelTable(tuple(range(levels)), tuple(f"m{i}" for i in range(models)), accuracy, cost, share)
        for threshold in (0.0, 0.3, 0.55, 0.8, 1.0):
            chosen = route_average(table, threshold)
            picked = [table.models.index(chosen[level]) for level in table.levels]
            accuracy_of = sum(share[i] * accuracy[i, m] for i, m in enumerate(picked))
            cost_of = sum(share[i] * cost[i, m] for i, m in enumerate(picked))
            expected = _brute_force(table, threshold)
            assert (accuracy_of, cost_of) == pytest.approx(expected), (table, threshold)


def _split(levels, correct, tokens) -> Outcomes:
    """Outcomes whose cost is tokens × the model's cost per token (1, 2, 4)."""
    return Outcomes(MODELS, levels, correct, np.asarray(tokens, dtype=float) * [1.0, 2.0, 4.0])


def test_measure_and_frontier_by_hand():
    # calibration: level 1 small is enough, level 2 needs the large model
    calibration = _split([1, 1, 2, 2], [[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 1, 1]], [[1, 1, 1]] * 4)
    test = _split([1, 1, 2], [[1, 0, 1], [1, 1, 1], [0, 1, 1]], [[2, 2, 2], [2, 2, 2], [4, 3, 3]])
    routed = measure(test, {1: "s", 2: "l"}.__getitem__)
    # example costs: 2·1, 2·1, 3·4 → mean 16/3; correct 1, 1, 1
    assert routed["accuracy"] == 1.0 and routed["cost"] == pytest.approx(16 / 3)
    assert routed["per_level"] == {1: {"accuracy": 1.0, "examples": 2}, 2: {"accuracy": 1.0, "examples": 1}}

    result = frontier(calibration, test, thresholds=[0.0, 0.9, 1.0], policies=["minimum"])
    # fixed sizes on the test split: s 2/3 correct at (2 + 2 + 4)/3; m 2/3 at (4 + 4 + 6)/3; l 3/3 at 28/3
    assert result["fixed"]["s"]["accuracy"] == pytest.approx(2 / 3)
    assert result["fixed"]["s"]["minimum_accuracy"] == 0.0
    assert result["fixed"]["m"]["cost"] == pytest.approx(14 / 3)
    assert result["fixed"]["l"]["cost"] == pytest.approx(28 / 3)
    points = result["routed"]["minimum"]
    # threshold 0 routes everything to s; 0.9 and 1.0 give the same routing (s, l): one point, both thresholds
    assert [p["assignment"] for p in points] == [{1: "s", 2: "s"}, {1: "s", 2: "l"}]
    assert points[1]["thresholds"] == [0.9, 1.0]
    beats = result["dominance"]["minimum"]  # in the minimum policy's metric: routed (s, s) 0 at 8/3, (s, l) 1 at 16/3
    # l (1 at 28/3): (s, l) as accurate for less
    assert beats["l"] == {
        "dominated": True,
        "gain_at_cost": 0.0,
        "cost_saving_at_accuracy": pytest.approx(1 - 16 / 28),
    }
    # m (0.5 at 14/3): within its cost only (s, s), 0.5 worse; reaching 0.5 costs 16/3, 1/7 more
    assert beats["m"] == {"dominated": False, "gain_at_cost": -0.5, "cost_saving_at_accuracy": pytest.approx(-1 / 7)}
    # s (0 at 8/3): (s, s) is the same point, not better
    assert beats["s"]["dominated"] is False and beats["s"]["gain_at_cost"] == 0.0


def test_thresholds_from_the_data_separate_sizes_whose_scores_are_tiny():
    """Per-token probabilities of a weak family (1e-10 … 1e-5): a fixed 0.01 grid sends every level to one size at
    every threshold but 0; the table's own values route each level to the size that clears it."""
    scores = np.array([[1e-6, 1e-5, 2e-5], [1e-10, 1e-7, 1e-5]])  # levels 1, 2 × sizes s, m, l
    calibration = _split([1, 2], scores, [[1, 2, 4]] * 2)
    assert data_thresholds(calibration.by_level()) == sorted(set(scores.ravel().tolist()))
    routed = frontier(calibration, calibration, policies=["minimum"])["routed"]["minimum"]
    # by hand: each threshold t, per level the cheapest size whose score >= t (the best size where none is)
    expected = []
    for t in sorted(set(scores.ravel())):
        clear = [[m for m in range(3) if row[m] >= t] or [int(np.argmax(row))] for row in scores]
        assignment = {level: MODELS[min(sizes)] for level, sizes in zip((1, 2), clear)}
        expected += [assignment] if assignment not in expected else []
    assert [p["assignment"] for p in routed] == expected
    assert len(expected) == 5  # (s, s), (s, m), (s, l), (m, l), (l, l)
    grid = frontier(calibration, calibration, thresholds=[round(t, 2) for t in np.linspace(0, 1, 101)],
                    policies=["minimum"])["routed"]["minimum"]  # fmt: skip
    assert len(grid) == 2  # everything to s at 0, every level to its best size above


def test_outcomes_are_checked():
    with pytest.raises(InputError, match="correct has shape"):
        Outcomes(MODELS, [1, 2], [[1, 0, 1]], [[1, 1, 1], [1, 1, 1]])
    calibration = _split([1], [[1, 1, 1]], [[1, 1, 1]])
    with pytest.raises(InputError, match=r"test levels \[2\] have no calibration examples"):
        frontier(calibration, _split([2], [[1, 1, 1]], [[1, 1, 1]]))


@pytest.mark.parametrize("architecture", ["llama", "gemma2"])
def test_model_cost_counts_the_loaded_models_parameters(tiny_kit, architecture):
    directory = tiny_kit.model_dir(architecture, "large")
    model = AutoModelForCausalLM.from_pretrained(directory)
    cost = model_cost(directory)
    embeddings = model.get_input_embeddings().weight
    total = sum(p.numel() for p in model.parameters())  # tied weights are one parameter
    assert cost.parameters == total
    tied = model.get_output_embeddings().weight is embeddings
    assert cost.forward_parameters == (total if tied else total - embeddings.numel())
    config = model.config
    assert cost.num_layers == config.num_hidden_layers
    assert cost.attention_width == config.num_attention_heads * config.head_dim


def test_a_patched_size_with_its_own_head_costs_less_than_the_tied_model_it_is_cut_from(tmp_path):
    from adapt_helpers import distilled_copy, init_student

    from kinfolk.plugins.adapt import merge
    from kinfolk.testing import build_model, save_model

    # a vocabulary whose matrix outweighs a block, as in real models, where the defect showed
    teacher = save_model(
        build_model("llama", "large", vocab_size=4096, tie_word_embeddings=True), None, tmp_path / "t"
    )
    student = distilled_copy(init_student(teacher, tmp_path / "init", every=2), tmp_path / "student", None)
    family = merge({"op": "patch", "teacher": str(teacher), "student": str(student)}, tmp_path / "family",
                   all_sizes=True, progress=False)  # fmt: skip
    multiplied = {}
    for size in ("k1", "k2"):  # k1: the student's embeddings and the teacher's head, untied; k2: the tied teacher
        model = AutoModelForCausalLM.from_pretrained(family / size)
        looked_up = model.get_input_embeddings().weight
        tied = model.get_output_embeddings().weight is looked_up
        multiplied[size] = sum(p.numel() for p in model.parameters() if tied or p is not looked_up)
        assert tied == (size == "k2")
    costs = {size: model_cost(family / size) for size in multiplied}
    assert costs["k1"].parameters > costs["k2"].parameters  # the stored count has one more vocabulary matrix
    for size, cost in costs.items():
        assert cost.of(7, "parameters") == 7 * multiplied[size]
    assert costs["k1"].of(7, "parameters") < costs["k2"].of(7, "parameters")
    assert costs["k1"].of(7, "flops") < costs["k2"].of(7, "flops")


def test_difficulty_rating_equals_one_unpadded_pass_per_prompt(tiny_kit, tiny_tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama", "small"))
    labels = ["1", "2", "3", "4", "5"]
    template = "How hard is {prompt}? Rating: "
    prompts = ["2 + 2", "the integral of x squared from zero to nine", "a", "reverse 'stone'"]
    rated = rate_difficulty(model, tiny_tokenizer, prompts, template, labels, batch_size=3)
    tokens = label_tokens(tiny_tokenizer, labels)
    for prompt, level in zip(prompts, rated):
        ids = tiny_tokenizer(template.replace("{prompt}", prompt), return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1]
        assert level == labels[int(logits[tokens].argmax())], prompt
    with pytest.raises(InputError, match="distinct tokens"):
        label_tokens(tiny_tokenizer, ["7 apples", "7 pears"])


@pytest.fixture(scope="module")
def patched_family(tiny_kit, tmp_path_factory):
    """Every size of a tiny 4-layer teacher's patched family (k0 = 2-layer student ... k2 = the teacher)."""
    from adapt_helpers import patched_family

    return patched_family(tiny_kit.model_dir("llama", "large"), tmp_path_factory.mktemp("route"))


def test_kinfolk_route_writes_the_librarys_frontier(patched_family, tmp_path, capsys):
    sizes = [entry["dir"] for entry in json.loads((patched_family / "family.json").read_text())["models"]]
    rng = np.random.default_rng(1)
    rows, tables = [], {}
    for split, n in (("calibration", 12), ("test", 9)):
        levels = [1 + i % 3 for i in range(n)]
        correct = (rng.random((n, len(sizes))) < [0.3, 0.6, 0.9]).astype(float)
        tokens = rng.integers(5, 20, size=(n, len(sizes)))
        tables[split] = (levels, correct, tokens)
        for i in range(n):
            for m, size in enumerate(sizes):
                rows.append({"split": split, "id": f"{split}-{i}", "model": size, "level": levels[i],
                             "correct": correct[i, m], "tokens": int(tokens[i, m])})  # fmt: skip
    (tmp_path / "outcomes.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "routing"
    argv = ["route", "--outcomes", str(tmp_path / "outcomes.jsonl"), "--models_dir", str(patched_family),
            "--cost", "flops", "--thresholds", "0.2", "0.5", "0.8", "--out", str(out)]  # fmt: skip
    assert kinfolk_main(argv) == 0
    written = json.loads((out / "routing.json").read_text())
    assert (out / "frontier.png").stat().st_size > 0
    # the same frontier from the library, with each example's FLOPs from the model's own cost figures
    costs = [model_cost(patched_family / size) for size in sizes]
    assert [c.num_layers for c in costs] == [2, 3, 4]  # smallest first, as the command orders them
    expected = frontier(
        *(
            Outcomes(tuple(sizes), levels, correct, [[c.of(t, "flops") for c, t in zip(costs, row)] for row in tokens])
            for levels, correct, tokens in tables.values()
        ),
        thresholds=[0.2, 0.5, 0.8],
    )
    assert written["models"] == sizes
    assert json.loads(json.dumps(expected, default=str)) == {
        key: written[key] for key in expected
    }  # JSON turns level keys into strings on both sides
    printed = capsys.readouterr().out
    assert all(f"| {size} |" in printed for size in sizes)

    # an example without a row for one model is named
    (tmp_path / "short.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows[:-1]))
    argv[2], argv[-1] = str(tmp_path / "short.jsonl"), str(tmp_path / "other")
    assert kinfolk_main(argv) == 2
    assert "example 'test-8' has no outcome for model(s) ['k2']" in capsys.readouterr().err


ROUTE_BAD_ROWS = {
    "no level": ({"level": None}, ["row 1 has no level"]),
    "unknown split": ({"split": "train"}, ["row 1 has split 'train'"]),
    "non-numeric correct": ({"correct": "yes"}, ["row 1 has a non-numeric or zero score or tokens (correct 'yes'"]),
}


@pytest.mark.parametrize("case", list(ROUTE_BAD_ROWS))
def test_kinfolk_route_refuses_bad_rows_in_one_line_naming_the_file(patched_family, tmp_path, case):
    from refusal_helpers import assert_command_refused

    change, named = ROUTE_BAD_ROWS[case]
    row = {"split": "calibration", "id": "a", "model": "k0", "level": 1, "correct": 1.0, "tokens": 5} | change
    outcomes = tmp_path / "outcomes.jsonl"
    outcomes.write_text(json.dumps(row) + "\n")
    out = tmp_path / "routing"
    argv = ["route", "--outcomes", outcomes, "--models_dir", patched_family, "--out", out]
    assert_command_refused(argv, outcomes, *named, destination=out, inputs=[outcomes])


def test_kinfolk_route_refuses_missing_inputs_and_options_before_reading(patched_family, tmp_path):
    from refusal_helpers import assert_command_refused

    row = {"split": "calibration", "id": "a", "model": "gone", "level": 1, "correct": 1.0, "tokens": 5}
    outcomes = tmp_path / "outcomes.jsonl"
    outcomes.write_text(json.dumps(row) + "\n" + json.dumps(row | {"split": "test"}) + "\n")
    out = tmp_path / "routing"
    (tmp_path / "taken").mkdir()
    common = ["route", "--outcomes", outcomes, "--models_dir", patched_family]
    cases = [
        ([*common, "--out", out], ["--outcomes model 'gone'", "does not exist"], out),
        (["route", "--outcomes", tmp_path / "none.jsonl", "--out", out], ["none.jsonl", "no such data file"], out),
        ([*common, "--out", tmp_path / "taken"], ["taken already exists"], None),
        ([*common, "--out", out, "--cost", "watts"], ["--cost must be one of"], out),
        ([*common, "--out", out, "--difficulty", "rating"], ["--difficulty rating needs --rater"], out),
        ([*common, "--out", out, "--difficulty", "rating", "--rater", tmp_path / "no-rater"], ["no-rater"], out),
        (["route", "--outcomes", outcomes, "--models_dir", tmp_path / "nowhere", "--out", out], ["nowhere"], out),
    ]
    for argv, named, destination in cases:
        assert_command_refused(argv, *named, destination=destination, inputs=[outcomes])
