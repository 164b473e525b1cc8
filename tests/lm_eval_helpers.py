"""Shared by the `kinfolk eval` tests: kinfolk's offline task, its per-sample log-likelihoods from the CLI's sample
files and from an in-process evaluation."""

import json

from lm_eval.tasks import TaskManager

from kinfolk.callbacks.evaluation import run_lm_eval
from kinfolk.eval_tasks import task_dir

TASK = "kinfolk_csqa_sample"


def log_likelihoods(samples):
    """Every option's log-likelihood, question after question, as one flat list."""
    return [float(choice[0]) for record in samples for choice in record["filtered_resps"]]


def cli_samples(output_path):
    files = list(output_path.rglob(f"samples_{TASK}_*.jsonl"))
    assert len(files) == 1, files
    with open(files[0]) as handle:
        return sorted((json.loads(line) for line in handle), key=lambda record: record["doc_id"])


def in_process(model, tokenizer):
    _, samples = run_lm_eval(
        model, tokenizer, [TASK], TaskManager(include_path=str(task_dir()), include_defaults=False), batch_size=2
    )
    return sorted(samples[TASK], key=lambda record: record["doc_id"])
