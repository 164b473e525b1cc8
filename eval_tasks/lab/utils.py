"""Data for the lab's tasks: test-split problems shipped in data/<skill>.jsonl, written by `kinfolk.lab.world.tasks`."""

from pathlib import Path

from kinfolk.eval_tasks.loading import load_task_data


def _load(skill: str, **options):
    options.setdefault("data_files", {"test": str(Path(__file__).parent / "data" / f"{skill}.jsonl")})
    return load_task_data(Path(__file__).parent, hub=("", None), splits=("test",), **options)


def load_add(**options):
    return _load("add", **options)


def load_reverse(**options):
    return _load("reverse", **options)


def load_copy(**options):
    return _load("copy", **options)


def load_flip(**options):
    return _load("flip", **options)
