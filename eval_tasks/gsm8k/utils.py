"""Data for the kinfolk GSM8K tasks (see eval_tasks/loading.py for the options)."""

from pathlib import Path

from kinfolk.eval_tasks.loading import load_task_data


def load(**options):
    return load_task_data(Path(__file__).parent, hub=("openai/gsm8k", "main"), splits=("train", "test"), **options)
