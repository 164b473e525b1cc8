"""How kinfolk's lm-eval tasks find their data: the Hub by default, local files on request, shipped samples offline.

A task's `utils.load` is its YAML's `custom_dataset: !function utils.load`. lm-eval calls it with the task's
`metadata` and `dataset_kwargs` as keyword arguments, so a user chooses the data without editing the YAML:

- nothing: the Hub dataset (`datasets.load_dataset(path, name)`), as lm-eval's own tasks do;
- `data_files` (in `--metadata '{"data_files": ...}'` or a YAML's `dataset_kwargs`): local files of any
  format `kinfolk.data` reads (JSON / JSONL / Parquet / CSV), one path (used for every split the task reads) or a
  `{split: path}` mapping;
- `source: sample`: the small files shipped beside the YAML (`<sample_folder>/<split>.jsonl`), found from `__file__` so
  they resolve the same from a wheel or a checkout and from any working directory. The `*_sample` tasks set this.

>>> from kinfolk.eval_tasks import task_dir
>>> data = load_task_data(task_dir() / "gsm8k", hub=("openai/gsm8k", "main"), source="sample")
>>> sorted(data), data["test"].num_rows > 0
(['test', 'train'], True)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import datasets

from kinfolk.data import load_data


def _local(files: Mapping[str, str | Path]) -> datasets.DatasetDict:
    # One load per split: splits may differ in schema (MBPP+ tests beside MBPP's few-shot prompt split).
    return datasets.DatasetDict({split: load_data(path) for split, path in files.items()})


def load_task_data(
    task_folder: str | Path,
    hub: tuple[str, str | None],
    splits: tuple[str, ...] = ("test",),
    source: str = "hub",
    data_files: str | Mapping[str, str] | None = None,
    sample_folder: str = "sample",
    **_ignored,
) -> datasets.DatasetDict:
    """The task's splits from the Hub, from `data_files`, or from `task_folder/<sample_folder>/<split>.jsonl`.

    `splits` names the splits a single `data_files` path stands for. Unknown keyword arguments (lm-eval passes
    the task's whole metadata, e.g. `version`) are ignored.
    """
    if data_files is not None:
        files = dict(data_files) if isinstance(data_files, Mapping) else dict.fromkeys(splits, data_files)
        return _local(files)
    if source == "sample":
        folder = Path(task_folder) / sample_folder
        return _local({path.stem: path for path in sorted(folder.glob("*.jsonl"))})
    if source != "hub":
        raise ValueError(f"source must be 'hub' or 'sample', got {source!r}")
    path, name = hub
    return datasets.load_dataset(path, name)
