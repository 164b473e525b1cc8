"""Datasets in and out of files: one reader and one writer, both chosen by the path.

Reading (`load_splits`, `load_data`) takes what `trl sft`'s `--dataset_name` takes and more:

| path | read as |
| --- | --- |
| `*.jsonl`, `*.json`, `*.parquet`, `*.csv`, `*.txt`, `*.arrow` | one split, with `datasets`' builder for the suffix |
| a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk` | `load_from_disk` |
| anything else (a Hub name, a folder of data files) | `load_dataset(name, config)`, as TRL's scripts do |

A local file that is missing (`MissingInputError`), empty (`EmptyDatasetError`) or unreadable
(`DatasetFormatError`), a split that is not there and a split with no rows are refused with the path named.
Writing (`save_dataset`) picks the format from `--out`: `*.jsonl` (JSON lines) or `*.parquet` are single files that
TRL's YAML `datasets:` mixtures (`path: json` / `parquet`, `data_files:`) and `load_splits` read; any other path
becomes a `save_to_disk` folder. Outputs appear whole or not at all (`kinfolk.atomic`).

>>> import tempfile, pathlib
>>> from kinfolk.testing import text_dataset
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> for out in ("rows.jsonl", "rows.parquet", "rows"):
...     _ = save_dataset(text_dataset(3), folder / out)
...     print(out, load_data(folder / out).num_rows)
rows.jsonl 3
rows.parquet 3
rows 3
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kinfolk.atomic import atomic_directory, atomic_file, check_destination
from kinfolk.errors import DatasetFormatError, EmptyDatasetError, InputError, MissingInputError, ScoringError

# `load_dataset` builder for a single local data file, by suffix.
FILE_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".txt": "text",
    ".arrow": "arrow",
}
# Below this size a file of nothing but blank lines counts as empty (checked by reading it).
_SMALL_FILE = 1 << 16
# File formats `save_dataset` writes; every other --out is a `save_to_disk` folder.
WRITTEN_FILES = (".jsonl", ".parquet")


@contextlib.contextmanager
def _quiet_builders() -> Iterator[None]:
    """Silence `datasets`' own log lines about a file it cannot parse: the error raised names it once."""
    import datasets

    level = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)


@contextlib.contextmanager
def naming(source: str | Path) -> Iterator[None]:
    """Errors about a dataset's columns or rows (`DatasetFormatError`, `ScoringError`) raised inside name `source`,
    the data the user gave, unless they already name a file.

    >>> with naming("train.jsonl"):
    ...     raise DatasetFormatError("row 3 has no 'completion'")
    Traceback (most recent call last):
    ...
    kinfolk.errors.DatasetFormatError: train.jsonl: row 3 has no 'completion'
    """
    try:
        yield
    except (DatasetFormatError, ScoringError) as error:
        if error.path is not None or str(source) in str(error):  # about another file, or naming it already
            raise
        raise type(error)(f"{source}: {error}", path=source) from None


def _saved_without_rows(folder: Path) -> bool:
    """Whether a `save_to_disk` folder (or one of its splits) was saved from a dataset without rows."""
    for state in folder.glob("**/state.json"):
        try:
            if json.loads(state.read_text()).get("_data_files") == []:
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


def _first_line(error: BaseException) -> str:
    cause = error.__cause__ or error
    lines = [line for line in str(cause).splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _load_file(path: Path, split: str, streaming: bool) -> dict[str, Any]:
    from datasets import load_dataset

    if not path.is_file():
        raise MissingInputError(f"{path}: no such data file", path=path)
    size = path.stat().st_size
    if size == 0 or (size < _SMALL_FILE and not path.read_bytes().strip()):
        raise EmptyDatasetError(f"{path} is empty", path=path)
    builder = FILE_BUILDERS[path.suffix]
    try:
        with _quiet_builders():
            dataset = load_dataset(builder, data_files=str(path), split="train", streaming=streaming)
    except Exception as error:  # the builders raise many types; all mean "this file is not what its suffix says"
        raise DatasetFormatError(f"{path} cannot be read as {builder}: {_first_line(error)}", path=path) from error
    return {split: dataset}


def load_splits(name: str | Path, config: str | None = None, streaming: bool = False, split: str = "train"):
    """The splits of a data file, a `save_to_disk` folder, a local data folder or a Hub dataset (a lone dataset
    becomes `split`), as a mapping of split name to dataset."""
    from datasets import load_dataset, load_from_disk

    path = Path(name)
    if path.suffix in FILE_BUILDERS and not path.is_dir():
        return _load_file(path, split, streaming)
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        try:
            saved = load_from_disk(str(path))
        except Exception as error:  # a damaged folder: missing arrow files, broken JSON, truncated tables
            if _saved_without_rows(path):  # `datasets` cannot load what it saved from an empty dataset
                raise EmptyDatasetError(f"{path} holds no rows", path=path) from error
            raise DatasetFormatError(
                f"{path} cannot be read as a saved dataset: {_first_line(error)}", path=path
            ) from error
        return saved if (path / "dataset_dict.json").is_file() else {split: saved}
    try:
        return load_dataset(str(name), name=config, streaming=streaming)
    except (FileNotFoundError, ConnectionError) as error:
        raise InputError(
            f"{name}: not a data file or folder here, and not a reachable dataset ({_first_line(error)})"
        ) from error


def load_data(path: str | Path, split: str = "train", config: str | None = None):
    """One split of what `load_splits` reads (`select_split`: a missing or empty split is refused).

    >>> load_data("no/such/rows.jsonl")
    Traceback (most recent call last):
    ...
    kinfolk.errors.MissingInputError: no/such/rows.jsonl: no such data file
    """
    return select_split(load_splits(path, config, split=split), split, path)


def select_split(splits, split: str, source: str | Path):
    """`splits[split]`, refusing a split that is not there (naming those that are) and one without rows, before
    TRL or a trainer reads its first row; `source` names the data in the message. A streamed split is not counted."""
    if split not in splits:
        raise DatasetFormatError(f"{source} has splits {list(splits)}, not {split!r}", path=source)
    dataset = splits[split]
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        raise EmptyDatasetError(
            f"{source}: split {split!r} holds no rows (columns {sorted(dataset.column_names or [])})", path=source
        )
    return dataset


def writes_folder(out: str | Path) -> bool:
    """Whether `save_dataset` writes `out` as a `save_to_disk` folder (else as one .jsonl or .parquet file)."""
    return Path(out).suffix not in WRITTEN_FILES


def check_output(out: str | Path, overwrite: bool = False) -> Path:
    """Refuse, before any work, an `out` that exists (unless `overwrite`) or names a data file kinfolk does not
    write (e.g. `.csv`, which cannot hold list columns faithfully)."""
    out = check_destination(out, overwrite)
    if writes_folder(out) and out.suffix in FILE_BUILDERS:
        raise InputError(
            f"{out}: kinfolk writes {' or '.join(WRITTEN_FILES)} files or a dataset folder, not {out.suffix}"
        )
    return out


def save_dataset(dataset, out: str | Path, overwrite: bool = False) -> Path:
    """Write `dataset` to `out` atomically: JSON lines for `*.jsonl`, Parquet for `*.parquet`, else a `save_to_disk`
    folder. Refuses what `check_output` refuses."""
    out = check_output(out, overwrite)
    if writes_folder(out):
        with atomic_directory(out, overwrite=overwrite) as staging:
            dataset.save_to_disk(str(staging))
        return out
    with atomic_file(out, mode="wb") as handle:
        if out.suffix == ".jsonl":
            # pandas' default keeps 10 significant digits; 15 is its maximum (scores and weights survive to ~1e-15)
            dataset.to_json(handle, lines=True, force_ascii=False, double_precision=15)
        else:
            dataset.to_parquet(handle)
    return out
