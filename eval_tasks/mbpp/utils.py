"""Data and pass@1 scoring for the kinfolk MBPP / MBPP+ tasks; code runs in kinfolk's sandbox (eval_tasks/execution.py)."""

import re
from pathlib import Path

import datasets

from kinfolk.eval_tasks.execution import check_allowed, pass_at_1
from kinfolk.eval_tasks.loading import load_task_data

FOLDER = Path(__file__).parent
FENCE = re.compile(r"```(?:[A-Za-z0-9_+-]*)\n(.*?)(?:```|$)", re.DOTALL)


def load(**options):
    check_allowed()  # refuse before generating anything, not after
    return load_task_data(FOLDER, hub=("google-research-datasets/mbpp", "full"), splits=("prompt", "test"), **options)


def load_plus(**options):
    check_allowed()
    if options.get("source", "hub") == "hub" and options.get("data_files") is None:
        # MBPP+ ships only its test split; its few-shot examples are MBPP's prompt split, as for MBPP.
        plus = datasets.load_dataset("evalplus/mbppplus")
        prompt = datasets.load_dataset("google-research-datasets/mbpp", "full")["prompt"]
        return datasets.DatasetDict({"test": plus["test"], "prompt": prompt})
    return load_task_data(
        FOLDER, hub=("evalplus/mbppplus", None), splits=("prompt", "test"), sample_folder="sample_plus", **options
    )


def extract_code(generation: str) -> str:
    """The code in a generation: the first fenced block when there is one, else the text up to any [DONE]."""
    fenced = FENCE.search(generation)
    code = fenced.group(1) if fenced else generation
    return code.split("[DONE]")[0].replace("[BEGIN]", "").strip("\n")


def process_results(doc, results):
    return {"pass_at_1": pass_at_1(extract_code(results[0]), doc["test_list"], doc.get("test_setup_code") or "")}


def process_results_plus(doc, results):
    setup = "\n".join(doc.get("test_imports") or [])
    return {"pass_at_1": pass_at_1(extract_code(results[0]), doc["test"], setup)}
