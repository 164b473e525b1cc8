"""`InputError`: the one base class for bad input — a file, row, tensor or field the user gave that cannot be used.

Every component raises a subclass (`DatasetFormatError`, `MergeConfigError`, `OutputExistsError`, ...) with a message
that names the culprit. The command line (`kinfolk.commands`) prints such an error as one line and exits 2, with no
traceback; any other exception is a runtime failure (exit 1). Python callers catch `InputError` (or `ValueError`,
which it extends) to tell the two apart.

>>> try:
...     raise InputError("train.jsonl: row 3 has no 'completion'")
... except ValueError as error:
...     print(error)
train.jsonl: row 3 has no 'completion'
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input (a file, row, tensor or config field) whose message names the culprit."""


class MissingInputError(InputError, FileNotFoundError):
    """A file or folder the user named does not exist."""
