"""lm-eval task YAMLs and their small local data; pass `task_dir()` to `lm_eval --include_path`.

>>> from kinfolk.eval_tasks import task_dir
>>> task_dir().name
'eval_tasks'
"""

from pathlib import Path


def task_dir() -> Path:
    """The folder lm-eval indexes for kinfolk's tasks (it works the same from a wheel or a checkout)."""
    return Path(__file__).resolve().parent
