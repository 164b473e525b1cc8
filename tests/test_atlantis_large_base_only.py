"""ATLANTIS for users: the `large_base_only` formula (one model at scoring time) and the report's extreme rows,
against hand computations.

A tiny scored dataset, five prompt/completion rows (a = large-base log-prob, b = small-base log-prob):

    row  completion      bytes   a       b      a/byte  (a-b)/byte
    0    " 4"            2      -1.0    -3.0    -0.5     +1.0
    1    " banana!!"     9      -9.0    -9.0    -1.0      0.0
    2    " 12"           3      -0.75   -3.0    -0.25    +0.75
    3    " 7"            2      -2.0    -1.0    -1.0     -0.5
    4    " qqqq zz"      8      -2.0    -8.0    -0.25    +0.75

(every value exact in binary, so the ties are ties)

`large_base_only` per byte, T = 1, no clip: w_i = exp(a_i/bytes_i) / mean_j exp(a_j/bytes_j).
"""

import json
import math

import numpy as np
import pytest
from datasets import Dataset

from kinfolk.commands import main
from kinfolk.plugins.atlantis import FORMULAS, ScoreConfig, check_scoring_inputs, compute_weights, weight_report
from kinfolk.plugins.atlantis.diagnostics import format_report
from kinfolk.testing import prompt_completion_dataset

COMPLETIONS = [" 4", " banana!!", " 12", " 7", " qqqq zz"]
A = [-1.0, -9.0, -0.75, -2.0, -2.0]
B = [-3.0, -9.0, -3.0, -1.0, -8.0]
PER_BYTE = [-0.5, -1.0, -0.25, -1.0, -0.25]


def tiny_scored(with_small_base: bool = True) -> Dataset:
    columns = {
        "prompt": [f"q{i}?" for i in range(5)],
        "completion": COMPLETIONS,
        "large_base_logprob": A,
        "response_bytes": [len(c.encode()) for c in COMPLETIONS],
    }
    if with_small_base:
        columns["small_base_logprob"] = B
    return Dataset.from_dict(columns)


def hand_weights(log_scores, temperature=1.0):
    raw = [math.exp(score / temperature) for score in log_scores]
    return [value / (sum(raw) / len(raw)) for value in raw]


def test_the_formula_reads_the_large_base_alone():
    assert FORMULAS["large_base_only"] == {"large_base": 1}
    assert ScoreConfig(formula="large_base_only").roles == ("large_base",)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_large_base_only_weights_by_hand(temperature):
    weights = compute_weights(tiny_scored(False), formula="large_base_only", clip="none", temperature=temperature)
    assert weights["weight"] == pytest.approx(hand_weights(PER_BYTE, temperature), rel=1e-12)


def test_large_base_only_with_the_default_quantile_clip():
    """np.quantile's linear rule at 1 % and 99 % of the sorted per-byte scores [-1, -1, -.5, -.25, -.25]:
    position 0.04 lies between -1 and -1, position 3.96 between -.25 and -.25, so nothing moves; a sharper spread
    does: scores [-3, -1, -.5, -.2, 0] clip at -3 + .04·2 = -2.92 and -.2 + .96·.2 = -0.008."""
    weights = compute_weights(tiny_scored(False), formula="large_base_only")
    assert weights["weight"] == pytest.approx(hand_weights(PER_BYTE), rel=1e-12)
    spread = tiny_scored(False).remove_columns("large_base_logprob")
    spread = spread.add_column("large_base_logprob", [-3.0 * 2, -1.0 * 9, -0.5 * 3, -0.2 * 2, 0.0])
    clipped = compute_weights(spread, formula="large_base_only")["weight"]
    assert clipped == pytest.approx(hand_weights([-2.92, -1.0, -0.5, -0.2, -0.008]), rel=1e-9)


def test_large_base_only_needs_no_small_model(tiny_kit):
    family = tiny_kit.family("llama")
    config = ScoreConfig(formula="large_base_only", use_cache=False)
    assert set(check_scoring_inputs({"large_base": family["large_base"]}, config)) == {"large_base"}
    with pytest.raises(ValueError, match="formula 'ratio' needs the small_base model; given: large_base"):
        check_scoring_inputs({"large_base": family["large_base"]}, ScoreConfig(formula="ratio", use_cache=False))


def test_kinfolk_score_with_the_large_base_alone(tiny_kit, tmp_path, capsys):
    family = tiny_kit.family("llama")
    data, out = tmp_path / "train.jsonl", tmp_path / "scored.jsonl"
    prompt_completion_dataset(8, seed=3).to_json(str(data))
    argv = ["score", "--data", str(data), "--large_base", str(family["large_base"]), "--out", str(out)]
    assert main([*argv, "--formula", "large_base_only", "--cache_dir", str(tmp_path / "cache")]) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert not any("small_base_logprob" in row for row in rows)
    per_byte = [row["large_base_logprob"] / row["response_bytes"] for row in rows]
    expected = np.quantile(per_byte, [0.01, 0.99])  # the default clip, then self-normalisation, by hand
    clipped = [min(max(score, expected[0]), expected[1]) for score in per_byte]
    assert [row["weight"] for row in rows] == pytest.approx(hand_weights(clipped), rel=1e-9)
    top = max(range(8), key=lambda i: (rows[i]["weight"], -i))
    assert "highest weights (row, weight, log-prob per byte" in printed
    assert printed.split("highest weights")[1].splitlines()[1].split()[0] == str(top)
    assert main([*argv, "--overwrite", "--formula", "ratio"]) == 2  # ratio still needs the small base
    assert "formula 'ratio' needs the small_base model" in capsys.readouterr().err


def test_report_lists_the_true_highest_and_lowest_weighted_rows():
    """`ratio` per byte, no clip: log scores (a-b)/byte = [1, 0, .75, -.5, .75]; by weight, highest first: rows 0,
    then 2 and 4 (a tie: the earlier row first), 1, 3."""
    report = weight_report(tiny_scored(), formula="ratio", clip="none")
    weights = hand_weights([1.0, 0.0, 0.75, -0.5, 0.75])
    highest, lowest = report["highest_weighted"], report["lowest_weighted"]
    assert [row["row"] for row in highest] == [0, 2, 4, 1, 3]
    assert [row["row"] for row in lowest] == [3, 1, 2, 4, 0]
    assert [row["weight"] for row in highest] == pytest.approx([weights[i] for i in (0, 2, 4, 1, 3)])
    assert highest[1]["log_probs"] == pytest.approx({"large_base": -0.25, "small_base": -1.0})
    assert highest[1]["response"] == " 12"
    table = format_report(report)
    assert "lowest weights (row, weight, log-prob per byte of each model scored, response):" in table
    assert f"       3  {weights[3]:8.4g}  large_base -1  small_base -0.5  ' 7'" in table


def test_report_shows_the_weighting_that_puts_nonsense_first():
    """Under `large_base_only` rows 2 and 4 tie at a/byte = -0.25: the nonsense answer " qqqq zz" is listed among
    the highest, which is what a look at the rows is for."""
    report = weight_report(tiny_scored(False), formula="large_base_only", clip="none")
    assert [row["row"] for row in report["highest_weighted"][:2]] == [2, 4]
    assert report["highest_weighted"][1]["response"] == " qqqq zz"
    assert report["highest_weighted"][1]["log_probs"] == pytest.approx({"large_base": -0.25})


def test_report_rows_with_more_rows_than_listed_and_skipped_rows():
    """Twelve rows, weights increasing with the row index, row 11 unscored (NaN): the five highest scored rows are
    10, 9, 8, 7, 6 and the five lowest 0-4; a long response is cut to 80 characters."""
    a = [float(i) for i in range(12)]
    a[11] = math.nan
    completions = [" x" * 60] + [f" r{i}" for i in range(1, 12)]
    scored = Dataset.from_dict(
        {"prompt": ["p"] * 12, "completion": completions, "large_base_logprob": a, "response_bytes": [1] * 12}
    )
    report = weight_report(scored, formula="large_base_only", clip="none")
    assert [row["row"] for row in report["highest_weighted"]] == [10, 9, 8, 7, 6]
    assert [row["row"] for row in report["lowest_weighted"]] == [0, 1, 2, 3, 4]
    first = report["lowest_weighted"][0]["response"]
    assert len(first) == 80 and first == (" x" * 60)[:79] + "…"
