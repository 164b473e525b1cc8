"""Opening a dataset by name the way `trl sft` does, plus the folders `Dataset.save_to_disk` writes.

>>> import tempfile
>>> from kinfolk.testing import text_dataset
>>> folder = tempfile.mkdtemp()
>>> text_dataset(2).save_to_disk(folder)
>>> load_splits(folder)["train"].num_rows
2
"""

from __future__ import annotations

from pathlib import Path


def load_splits(name: str, config: str | None = None, streaming: bool = False, split: str = "train"):
    """The splits of a Hub dataset, a local data folder or a `save_to_disk` folder (a lone Dataset becomes `split`)."""
    from datasets import load_dataset, load_from_disk

    path = Path(name)
    if (path / "dataset_dict.json").is_file():
        return load_from_disk(str(path))
    if (path / "state.json").is_file():
        return {split: load_from_disk(str(path))}
    return load_dataset(name, name=config, streaming=streaming)
