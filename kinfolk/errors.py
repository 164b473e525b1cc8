"""`InputError`: the one base class for bad input — a file, row, tensor or field the user gave that cannot be used.

Every error kinfolk raises for bad input is defined here as a subclass, with a message on one line that names the
culprit (the file, row, tensor or config field). The command line (`kinfolk.commands`) prints such an error as one
line and exits 2, with no traceback; any other exception is a runtime failure (exit 1) or a bug. Python callers
catch `InputError` (or `ValueError`, which it extends) to tell the two apart. The types that are also about a path
derive from the matching `OSError` too (`FileNotFoundError`, `FileExistsError`, `PermissionError`), so code that
catches those keeps working. `nearest` and `did_you_mean` find the known name (an option, a config key, a log's
key) a mistyped one was probably meant as, for hints. The modules that raise them re-export them where they were first defined
(`kinfolk.tokens.DatasetFormatError`, `kinfolk.plugins.adapt.CheckpointError`, ...).

>>> try:
...     raise InputError("train.jsonl: row 3 has no 'completion'")
... except ValueError as error:
...     print(error)
train.jsonl: row 3 has no 'completion'
>>> error = CorruptFileError("adapter_model.safetensors is truncated", path="out/adapter_model.safetensors")
>>> error.path
'out/adapter_model.safetensors'
>>> issubclass(OutputExistsError, FileExistsError) and issubclass(OutputExistsError, InputError)
True
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# How hints spell an option: as keyword arguments ("python") unless the command line runs ("cli", `cli_spelling`).
_spelling = "python"


@contextlib.contextmanager
def cli_spelling() -> Iterator[None]:
    """Inside, `option` spells options as command-line flags: the command line (`kinfolk.commands.run`) uses it."""
    global _spelling
    previous, _spelling = _spelling, "cli"
    try:
        yield
    finally:
        _spelling = previous


def option(name: str, value: Any = True) -> str:
    """How the user sets option `name` to `value`, for a hint in an error: `--name value` (or `--name` for True)
    from the command line, `name=value` from Python.

    >>> option("overlong", "skip")
    "overlong='skip'"
    >>> with cli_spelling():
    ...     option("overlong", "skip"), option("overwrite")
    ('--overlong skip', '--overwrite')
    """
    if _spelling == "cli":
        return f"--{name}" if value is True else f"--{name} {value}"
    return f"{name}={value!r}"


def option_name(name: str, flag: str | None = None) -> str:
    """An option's name as the user spells it: `--name` (or `flag`, when the command line names it otherwise) from
    the command line, `name` from Python."""
    return (flag or f"--{name}") if _spelling == "cli" else name


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to `name` when one is close enough to be what was meant (difflib's ratio >= 0.75),
    else None. `-` and `_` count as the same character, as the options' two spellings do; of a name's spellings
    the one nearer the user's is given.

    >>> nearest("--learnng_rate", ["--learning-rate", "--learning_rate", "--lr_scheduler_type"])
    '--learning_rate'
    >>> nearest("--bogus", ["--learning_rate"]) is None
    True
    """
    spellings: dict[str, list[str]] = {}
    for item in known:
        spellings.setdefault(item.replace("-", "_"), []).append(item)
    found = difflib.get_close_matches(name.replace("-", "_"), list(spellings), n=1, cutoff=0.75)
    if not found:
        return None
    return max(spellings[found[0]], key=lambda item: difflib.SequenceMatcher(None, name, item).ratio())


def did_you_mean(name: str, known: Iterable[str], quote: bool = False) -> str:
    """`; did you mean X?` for the nearest known name (quoted as a key with `quote`), or "" when none is near."""
    match = nearest(name, known)
    return f"; did you mean {match!r}?" if match and quote else f"; did you mean {match}?" if match else ""


class InputError(ValueError):
    """Bad input from the user: a file, dataset, model, config field or option kinfolk cannot use as given.

    `path` is the offending file or directory when there is one (the message names it either way).
    """

    def __init__(self, message: str, path: str | Path | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)


# --- files and outputs -------------------------------------------------------------------------------------------


class MissingInputError(InputError, FileNotFoundError):
    """An input file or directory that does not exist (or lacks a file it must hold)."""


class CorruptFileError(InputError):
    """An input file that exists but cannot be read: a truncated safetensors file, broken JSON, a damaged archive."""


class OutputExistsError(InputError, FileExistsError):
    """The destination exists and the caller did not ask to overwrite it."""


class OutputNotWritableError(InputError, PermissionError):
    """The destination cannot be created: its parent is a file, read-only, or not permitted."""


class NotEnoughSpaceError(InputError):
    """The destination's file system has fewer bytes free than the output needs (found before any work)."""


# --- datasets ----------------------------------------------------------------------------------------------------


class DatasetFormatError(InputError):
    """The dataset does not have the columns or contents an SFT dataset needs."""


class EmptyDatasetError(DatasetFormatError):
    """A dataset with no rows (or none left to use) where rows are needed."""


class WeightColumnError(DatasetFormatError):
    """The weight column of a weighted SFT dataset is missing, non-numeric, negative, non-finite or all zero."""


class ScoringError(InputError):
    """A row cannot be scored (overlong, nothing to score, non-finite result); the message names row and model."""


# --- models ------------------------------------------------------------------------------------------------------


class ModelInputError(InputError):
    """A model argument that cannot serve: no such directory, no loadable config, no weights, no tokenizer."""


class UnsupportedArchitectureError(InputError):
    """The model's architecture is not one kinfolk knows the layout of."""


# --- ADAPT merges --------------------------------------------------------------------------------------------------


class CheckpointError(InputError):
    """An input directory that is not the kind of checkpoint the operation needs."""


class TensorMismatchError(InputError):
    """Two inputs whose tensors do not line up; `kind` is missing, extra, shape or dtype and `tensor` the name."""

    def __init__(self, message: str, kind: str = "", tensor: str = ""):
        super().__init__(message)
        self.kind, self.tensor = kind, tensor


class LayerMapError(InputError):
    """A layer-selection rule or a layer map that does not describe a partition of the teacher's layers."""


class LayerMapMismatchError(InputError):
    """Inputs built on different layer maps (e.g. a delta from another layer selection)."""


class TeacherMismatchError(InputError):
    """A teacher whose fingerprint differs from the one recorded when the student was initialised from it."""


class MergeError(InputError):
    """A tensor the plan cannot compute (e.g. an integer tensor in a weighted sum)."""


# --- ATLAS adapters ----------------------------------------------------------------------------------------------


class AdapterConfigError(InputError):
    """An ATLAS config that does not fit the module it adapts (e.g. a rank above the module's width)."""


class AdapterConfigMismatchError(InputError):
    """A saved adapter whose tensors disagree with its own adapter_config.json (a field edited after saving)."""


class AdapterBaseMismatchError(InputError):
    """A saved adapter loaded onto a base model it was not made for (modules of other widths)."""
