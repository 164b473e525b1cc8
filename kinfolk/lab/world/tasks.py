"""The lab's lm-eval tasks (`eval_tasks/lab/`): `kinfolk_lab_add`, `kinfolk_lab_reverse`, `kinfolk_lab_copy`.

Their data are test-split problems with the preferred-format answer as target, written deterministically by
`write_task_data` and shipped beside the YAMLs; `evaluate_with_lm_eval` runs them in-process on a model object.

>>> [row["prompt"] for row in task_rows("add", 2)]
['36+25=', '61+26=']
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from kinfolk.atomic import atomic_file
from kinfolk.lab.world.corpus import eval_problems
from kinfolk.lab.world.skills import SKILLS, render

TASK_PROBLEMS = 200
TASKS = {skill: f"kinfolk_lab_{skill}" for skill in SKILLS}


def task_data_dir() -> Path:
    from kinfolk.eval_tasks import task_dir

    return task_dir() / "lab" / "data"


def task_rows(skill: str, n: int = TASK_PROBLEMS) -> list[dict[str, str]]:
    problems = eval_problems(skill, n, seed=0)
    return [{"prompt": p, "answer": render(a)} for p, a in zip(problems["prompt"], problems["answer"])]


def write_task_data(directory: str | Path | None = None) -> list[Path]:
    """(Re)write data/<skill>.jsonl for every skill; the shipped files must equal what this writes."""
    directory = Path(directory or task_data_dir())
    written = []
    for skill in SKILLS:
        with atomic_file(directory / f"{skill}.jsonl") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in task_rows(skill))
        written.append(directory / f"{skill}.jsonl")
    return written


@cache
def _task_manager():
    """lm-eval's task index of kinfolk's tasks alone, built once per process: the lab's tasks need none of lm-eval's
    built-in ones, whose thousands of YAMLs took half a minute of CPU to index."""
    from lm_eval.tasks import TaskManager

    from kinfolk.eval_tasks import task_dir

    return TaskManager(include_path=str(task_dir()), include_defaults=False)


def evaluate_with_lm_eval(model, tokenizer, skills: list[str] | None = None, limit: int | None = None) -> dict:
    """{skill: exact_match} of the lab's lm-eval tasks on `model` (in-process, greedy; `kinfolk.callbacks`' runner,
    so RNG states and train/eval mode are restored; the lab models' 64 positions bound lm-eval's context)."""
    from kinfolk.callbacks.evaluation import run_lm_eval

    skills = skills or list(SKILLS)
    output, _ = run_lm_eval(model, tokenizer, [TASKS[s] for s in skills], _task_manager(), limit, batch_size=64)
    return {skill: float(output["results"][TASKS[skill]]["exact_match,none"]) for skill in skills}


if __name__ == "__main__":
    print("\n".join(map(str, write_task_data())))
