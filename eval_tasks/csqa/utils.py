"""Data for the kinfolk CommonsenseQA task (see eval_tasks/loading.py for the options)."""

from pathlib import Path

from kinfolk.eval_tasks.loading import load_task_data


def load(**options):
    return load_task_data(
        Path(__file__).parent, hub=("tau/commonsense_qa", None), splits=("train", "validation"), **options
    )
