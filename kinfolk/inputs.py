"""Checks of user inputs at the boundary: JSON and JSON-lines files, model directories and their configs, tokenizers
and weights.

Each check reads as little as it can (JSON files, safetensors headers) and turns the libraries' errors, which
often lack the path or bury it in a traceback, into one-line `kinfolk.errors` errors naming the file and the
role the user gave it ("teacher", "small_base", ...). Verbs call them before any expensive pass.

>>> import tempfile, pathlib
>>> missing = pathlib.Path(tempfile.mkdtemp()) / "no-such-model"
>>> try:
...     check_model(missing, "small_base")
... except ModelInputError as error:
...     print(str(error).replace(str(missing), "DIR"))
small_base model DIR: no such directory, and not a model id in the local Hugging Face cache
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kinfolk.errors import CorruptFileError, MissingInputError, ModelInputError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# Weight files transformers loads, in its order of preference (`kinfolk.tensors.SINGLE_FILE`, `INDEX_FILE` first;
# spelled out here so that the checks' module imports neither torch nor transformers until a model is checked).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def read_json(path: str | Path, what: str = "file") -> Any:
    """The parsed contents of a JSON file; a missing or malformed one raises an error naming it and `what` it is."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise MissingInputError(f"the {what} {path} does not exist", path=path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CorruptFileError(f"the {what} {path} is not valid JSON ({error})", path=path) from None


def json_document(path: str | Path) -> Any:
    """The file parsed as one JSON document, or None when it is not one."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def read_json_lines(
    path: str | Path,
    what: str,
    is_entry: Callable[[Any], bool] = lambda entry: isinstance(entry, dict),
    entry: str = "a JSON object",
) -> list[Any]:
    """The entries of a JSON-lines file, blank lines skipped; a missing file (`no such {what}`), a file that is not
    text, and a line that is not JSON or not `entry` (`is_entry` false) are refused naming the file and line."""
    entries = []
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as error:
                    if not entries and json_document(path) is not None:  # e.g. pretty-printed JSON
                        raise CorruptFileError(
                            f"{path} is one JSON document, not a {what} of JSON lines ({entry} per line)", path=path
                        ) from None
                    raise CorruptFileError(f"{path}:{number} is not JSON ({error})", path=path) from None
                if not is_entry(value):
                    raise CorruptFileError(f"{path}:{number} is not {entry}", path=path)
                entries.append(value)
    except FileNotFoundError:
        raise MissingInputError(f"{path}: no such {what}", path=path) from None
    except UnicodeDecodeError as error:
        raise CorruptFileError(f"{path} is not a text file of JSON lines ({error.reason})", path=path) from None
    return entries


def is_local_path(path: str | Path) -> bool:
    """A path the user means as a directory (not a Hub id such as `org/name`)."""
    text = str(path)
    return Path(text).exists() or text.startswith((".", "/", "~")) or text.count("/") != 1


def model_config(path: str | Path, role: str) -> PretrainedConfig:
    """`AutoConfig.from_pretrained(path)`, its failures named by role and path."""
    from transformers import AutoConfig

    if is_local_path(path) and not Path(path).is_dir():
        if Path(path).exists():
            raise ModelInputError(f"{role} model {path} is a file; give the model's directory", path=path)
        raise ModelInputError(
            f"{role} model {path}: no such directory, and not a model id in the local Hugging Face cache", path=path
        )
    if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
        raise ModelInputError(f"{role} model {path} has no config.json, so it is not a model directory", path=path)
    if Path(path).is_dir():  # the libraries' own errors about a broken JSON file often do not name it
        for file in sorted(Path(path).glob("*.json")):
            read_json(file, f"{role} model's file")
    try:
        return AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError, KeyError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelInputError(f"{role} model {path}: cannot load its config ({reason})", path=path) from None


def check_model(path: str | Path, role: str, tokenizer: bool = True) -> PretrainedConfig:
    """Refuse a model that cannot be loaded: config, weight files (safetensors headers read) and, if asked, the
    tokenizer. Returns the config. Hub ids are checked as far as the offline cache allows."""
    from transformers import AutoTokenizer

    from kinfolk.tensors import INDEX_FILE, SINGLE_FILE, TensorReader

    config = model_config(path, role)
    directory = Path(path)
    if directory.is_dir():
        present = [name for name in WEIGHT_FILES if (directory / name).is_file()]
        if not present:
            raise ModelInputError(
                f"{role} model {path} has no weights ({', '.join(WEIGHT_FILES)}); was its save interrupted?",
                path=path,
            )
        if present[0] in (SINGLE_FILE, INDEX_FILE):
            try:
                TensorReader(directory)  # opens every shard's header: a truncated file is named here
            except (CorruptFileError, MissingInputError) as error:
                raise type(error)(f"{role} model: {error}", path=error.path) from None
    if tokenizer:
        try:
            AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError, KeyError, TypeError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ModelInputError(f"{role} model {path}: cannot load its tokenizer ({reason})", path=path) from None
    return config
