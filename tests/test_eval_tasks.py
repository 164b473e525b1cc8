"""kinfolk's lm-eval tasks, run offline on their shipped samples by an oracle LM whose answers we control.

The oracle answers each question correctly unless told which ones to get wrong (and with what), so every
score and every churn count below is known in advance.
"""

import pytest
from lm_eval import simple_evaluate
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager

from kinfolk.callbacks.evaluation import score_metrics, write_samples
from kinfolk.drift.churn import churn_counts, outcomes, read_samples
from kinfolk.eval_tasks import task_dir
from kinfolk.eval_tasks.execution import ALLOW_ENV, CodeExecutionNotAllowed
from kinfolk.eval_tasks.loading import load_task_data

SAMPLE_TASKS = ["kinfolk_gsm8k_sample", "kinfolk_mbpp_sample", "kinfolk_mbpp_plus_sample", "kinfolk_csqa_sample"]


def gold(doc):
    if "answerKey" in doc:
        return doc["answerKey"]
    if "answer" in doc:
        return doc["answer"].split("####")[-1].strip()
    return doc["code"]


class OracleLM(LM):
    """Right answers, except `wrong[key] = offset` for the question whose gold answer (or code) is `key`."""

    def __init__(self, wrong=None):
        super().__init__()
        self.wrong = wrong or {}

    def generate_until(self, requests):
        answers = []
        for request in requests:
            doc, answer = request.doc, gold(request.doc)
            offset = self.wrong.get(answer)
            if "code" in doc:
                code = answer if offset is None else answer.replace("return", f"return {offset} +", 1)
                answers.append(f"{code}\n[DONE]")
            else:
                number = answer if offset is None else str(int(answer.replace(",", "")) + offset)
                answers.append(f" Working it out.\n#### {number}")
        return answers

    def loglikelihood(self, requests):
        scores = []
        for request in requests:
            answer = gold(request.doc)
            chosen = "ABCDE"[("ABCDE".index(answer) + self.wrong.get(answer, 0)) % 5]
            scores.append((0.0 if request.args[1].strip() == chosen else -3.0, False))
        return scores

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError


def kinfolk_tasks():
    """Only kinfolk's folder: indexing lm-eval's thousands of built-in YAMLs costs half a minute on two cores."""
    return TaskManager(include_path=str(task_dir()), include_defaults=False)


def evaluate(lm, tasks=SAMPLE_TASKS):
    output = simple_evaluate(
        model=lm,
        tasks=tasks,
        task_manager=kinfolk_tasks(),
        log_samples=True,
        bootstrap_iters=0,
        confirm_run_unsafe_code=True,
    )
    return output, output["samples"]


@pytest.fixture
def allow_code(monkeypatch):
    monkeypatch.setenv(ALLOW_ENV, "1")


def test_sample_tasks_score_an_oracle_perfectly(allow_code):
    output, samples = evaluate(OracleLM())
    scores = score_metrics(output, samples)
    assert scores["lm_eval/kinfolk_gsm8k_sample/exact_match/strict-match"] == 1.0
    assert scores["lm_eval/kinfolk_gsm8k_sample/exact_match/flexible-extract"] == 1.0
    assert scores["lm_eval/kinfolk_mbpp_sample/pass_at_1"] == 1.0
    assert scores["lm_eval/kinfolk_mbpp_plus_sample/pass_at_1"] == 1.0
    assert scores["lm_eval/kinfolk_csqa_sample/acc"] == 1.0
    assert scores["lm_eval/kinfolk_mbpp_sample/pass_at_1_count"] == 4.0
    assert len(samples["kinfolk_gsm8k_sample"]) == 2 * 6  # two filters × six questions


def test_wrong_answers_score_zero_and_plus_tests_are_stricter(allow_code):
    # 0 + ... keeps sum_squares([]) == 0 but breaks the others; the plus tests catch what the base tests miss.
    sneaky = "def sum_squares(nums):\n    return sum(x * x for x in nums[:3])"
    wrong = {"12": 1, "210": 1, "15": 1, "260": 1, "875": 1, "B": 1, "C": 1, "A": 1, "D": 1, "E": 1}
    output, samples = evaluate(OracleLM(wrong), ["kinfolk_gsm8k_sample", "kinfolk_csqa_sample"])
    scores = score_metrics(output, samples)
    assert scores["lm_eval/kinfolk_gsm8k_sample/exact_match/strict-match"] == 0.0
    assert scores["lm_eval/kinfolk_csqa_sample/acc"] == 0.0

    class Sneaky(OracleLM):
        def generate_until(self, requests):
            return [
                f"{sneaky}\n[DONE]" if "sum_squares" in r.doc["code"] else f"{r.doc['code']}\n[DONE]" for r in requests
            ]

    output, samples = evaluate(Sneaky(), ["kinfolk_mbpp_sample", "kinfolk_mbpp_plus_sample"])
    scores = score_metrics(output, samples)
    assert scores["lm_eval/kinfolk_mbpp_sample/pass_at_1_count"] == 4.0  # its three asserts use short lists
    assert scores["lm_eval/kinfolk_mbpp_plus_sample/pass_at_1_count"] == 3.0


def test_churn_from_lm_eval_sample_logs(allow_code, tmp_path):
    # GSM8K golds: 12, 210, 15, 12, 260, 875. Frozen gets 15 and 260 wrong (answers 16, 261). Adapted answers
    # 17 for the 15 (W), 260 right (G), 215 for the 210 (F) and 15 for both 12s (F twice): five changes.
    frozen_lm, adapted_lm = OracleLM({"15": 1, "260": 1}), OracleLM({"15": 2, "210": 5, "12": 3})
    _, frozen = evaluate(frozen_lm, ["kinfolk_gsm8k_sample", "kinfolk_csqa_sample"])
    _, adapted = evaluate(adapted_lm, ["kinfolk_gsm8k_sample", "kinfolk_csqa_sample"])
    write_samples(tmp_path / "frozen", frozen)  # and read back, as `kinfolk churn` would
    frozen = {"kinfolk_gsm8k_sample": read_samples(tmp_path / "frozen" / "samples_kinfolk_gsm8k_sample.jsonl")}
    counts = churn_counts(
        outcomes(frozen["kinfolk_gsm8k_sample"], filter_name="strict-match"),
        outcomes(adapted["kinfolk_gsm8k_sample"], filter_name="strict-match"),
    )
    assert counts == {"C": 5, "F": 3, "G": 1, "W": 1, "n": 6, "frozen_correct": 4, "adapted_correct": 2}

    # CSQA conditional choice: frozen right everywhere; adapted moves the choice on two questions
    _, frozen_mc = evaluate(OracleLM(), ["kinfolk_csqa_sample"])
    _, adapted_mc = evaluate(OracleLM({"B": 1, "E": 2}), ["kinfolk_csqa_sample"])
    counts = churn_counts(outcomes(frozen_mc["kinfolk_csqa_sample"]), outcomes(adapted_mc["kinfolk_csqa_sample"]))
    assert (counts["C"], counts["F"], counts["n"]) == (2, 2, 5)


def test_code_tasks_refuse_without_opt_in(monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(CodeExecutionNotAllowed):
        kinfolk_tasks().load_task_or_group(["kinfolk_mbpp_sample"])  # public in lm-eval 0.4.11 and 0.4.13


def test_local_files_and_bad_sources(tmp_path):
    local = tmp_path / "mine.jsonl"
    local.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    data = load_task_data(task_dir() / "gsm8k", hub=("openai/gsm8k", "main"), splits=("test",), data_files=str(local))
    assert data["test"][0]["answer"] == "#### 2"
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl"):
        load_task_data(task_dir() / "gsm8k", hub=("x", None), data_files=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="source"):
        load_task_data(task_dir() / "gsm8k", hub=("x", None), source="web")
