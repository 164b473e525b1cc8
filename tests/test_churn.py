"""Churn counts, rates and paired comparisons against a small example worked out by hand."""

import numpy as np
import pytest

from kinfolk.drift.churn import Outcome, churn_counts, churn_report, compare_churn, outcomes

# Eight questions. Frozen: right on q0–q3, wrong on q4–q7.
FROZEN = {f"q{i}": Outcome(str(i), i < 4) for i in range(8)}
# Method: q0 correct→wrong (F); q4 wrong→correct (G); q5 wrong→other wrong (W); the rest unchanged.
METHOD = {**FROZEN, "q0": Outcome("x", False), "q4": Outcome("4!", True), "q5": Outcome("y", False)}
# Comparator: F on q0, q1; G on q4; W on q5, q6, q7; q2, q3 unchanged.
COMPARATOR = {
    **FROZEN,
    "q0": Outcome("x", False),
    "q1": Outcome("x", False),
    "q4": Outcome("4!", True),
    "q5": Outcome("y", False),
    "q6": Outcome("y", False),
    "q7": Outcome("z", False),
}


def test_counts_and_rates_by_hand():
    counts = churn_counts(FROZEN, METHOD)
    assert counts == {"C": 3, "F": 1, "G": 1, "W": 1, "n": 8, "frozen_correct": 4, "adapted_correct": 4}
    report = churn_report(FROZEN, METHOD, n_resamples=500)
    assert report["C_rate"]["estimate"] == 3 / 8
    assert report["F_rate"]["estimate"] == 1 / 4  # per frozen-correct question
    assert report["G_rate"]["estimate"] == 1 / 4 and report["W_rate"]["estimate"] == 1 / 4  # per frozen-wrong
    for kind in "CFGW":
        interval = report[f"{kind}_rate"]
        assert 0.0 <= interval["low"] <= interval["estimate"] <= interval["high"] <= 1.0
    assert report["frozen_accuracy"] == report["adapted_accuracy"] == 0.5


def test_paired_reduction_by_hand():
    report = compare_churn(FROZEN, METHOD, COMPARATOR, n_resamples=1000)
    assert (report["C"]["method"], report["C"]["comparator"]) == (3, 6)
    assert report["C"]["estimate"] == pytest.approx(0.5)
    assert report["F"]["estimate"] == pytest.approx(0.5)
    assert report["G"]["estimate"] == pytest.approx(0.0)
    assert report["W"]["estimate"] == pytest.approx(2 / 3)
    assert report["F+G"]["estimate"] == pytest.approx(1 - 2 / 3)
    assert report["accuracy_difference"] == pytest.approx(1 / 8)
    # The method never changes more than the comparator on any question, so no resample can favour the comparator.
    assert report["C"]["low"] >= 0.0


def test_paired_bootstrap_matches_a_direct_resampling():
    report = compare_churn(FROZEN, METHOD, COMPARATOR, n_resamples=2000, seed=3)
    rng = np.random.default_rng(3)
    ours = np.array([FROZEN[k].answer != METHOD[k].answer for k in FROZEN], dtype=float)
    theirs = np.array([FROZEN[k].answer != COMPARATOR[k].answer for k in FROZEN], dtype=float)
    replicates = []
    for idx in rng.integers(0, 8, size=(2000, 8)):
        if theirs[idx].sum() > 0:
            replicates.append(1 - ours[idx].sum() / theirs[idx].sum())
    low, high = np.quantile(replicates, [0.025, 0.975])
    assert (report["C"]["low"], report["C"]["high"]) == pytest.approx((low, high))


def test_mismatched_questions_are_an_error():
    with pytest.raises(ValueError, match="same questions"):
        churn_counts(FROZEN, {k: v for k, v in METHOD.items() if k != "q7"})


def record(doc_id, doc_hash, response, correct, filter_name="none", metric="exact_match"):
    return {
        "doc_id": doc_id,
        "doc_hash": doc_hash,
        "filtered_resps": [response],
        "filter": filter_name,
        "metrics": [metric],
        metric: float(correct),
    }


def test_outcomes_from_records():
    records = [record(0, "h0", "  12 ", True), record(1, "h1", "7", False)]
    parsed = outcomes(records)
    assert parsed == {"h0": Outcome("12", True), "h1": Outcome("7", False)}
    multiple_choice = [{**record(0, "h0", None, True, metric="acc"), "filtered_resps": [[-2.0, False], [-0.5, True]]}]
    assert outcomes(multiple_choice)["h0"] == Outcome(1, True)
    with pytest.raises(ValueError, match=r"several filters .*; choose one with filter_name$"):
        outcomes([*records, record(0, "h0", "12", True, filter_name="flexible")])
    with pytest.raises(KeyError, match="no metric 'acc'"):
        outcomes(records, metric="acc")
    repeated = outcomes([record(0, "same", "1", True), record(1, "same", "2", True)])
    assert set(repeated) == {(0, "same"), (1, "same")}  # repeated hashes fall back to (doc_id, hash)


def test_churn_verb_prints_and_writes(tmp_path, capsys):
    import json

    from kinfolk.commands import main

    def write(name, run):
        path = tmp_path / f"{name}.jsonl"
        rows = [record(i, f"h{i}", outcome.answer, outcome.correct) for i, outcome in enumerate(run.values())]
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return str(path)

    paths = [write(name, run) for name, run in (("frozen", FROZEN), ("method", METHOD), ("comparator", COMPARATOR))]
    out = tmp_path / "churn.json"
    assert main(["churn", *paths, "--bootstrap", "200", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| C | 3 | 37.50" in printed and "| W | 1 | 3 | 66.67" in printed
    saved = json.loads(out.read_text())
    assert saved["comparison"]["C"]["estimate"] == pytest.approx(0.5)
    assert main(["churn", *paths, "--out", str(out)]) == 2  # bad input: one line, no traceback
    assert "already exists" in capsys.readouterr().err


def test_a_rate_over_no_question_is_shown_as_such(tmp_path, capsys):
    import json

    from kinfolk.commands import main

    paths = []
    for name in ("frozen", "adapted"):  # both wrong everywhere: no frozen-correct question, so no F rate
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(record(i, f"h{i}", "x", False)) + "\n" for i in range(3)))
        paths.append(str(path))
    assert main(["churn", *paths, "--bootstrap", "50"]) == 0
    printed = capsys.readouterr().out
    assert "| F | 0 | — (no such question) | frozen-correct |" in printed and "nan" not in printed
