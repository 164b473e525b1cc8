"""Safetensors checkpoints read one tensor at a time and written in shards with an index.

`TensorReader` opens a model directory (one `model.safetensors` or shards listed in
`model.safetensors.index.json`) and hands out tensors by name without loading the rest.
A file that is not readable safetensors (truncated, or not safetensors at all) raises
`kinfolk.errors.CorruptFileError` naming it, instead of the library's bare "incomplete metadata".
`ShardedWriter` collects tensors into shards of at most `max_shard_bytes` and writes the index transformers
reads; pair it with `kinfolk.atomic.atomic_directory` so the directory appears only when complete.

>>> import tempfile, pathlib, torch
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> with ShardedWriter(root, max_shard_bytes=64) as writer:
...     writer.add("a", torch.zeros(8)); writer.add("b", torch.ones(8))
>>> reader = TensorReader(root)
>>> reader.names(), float(reader.get("b").sum())
(['a', 'b'], 8.0)
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from kinfolk.errors import CorruptFileError, MissingInputError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


@contextlib.contextmanager
def open_safetensors(path: str | Path) -> Iterator[Any]:
    """`safetensors.safe_open(path)` whose failures to parse name the file (`CorruptFileError`)."""
    try:
        handle = safe_open(str(path), framework="pt")
    except SafetensorError as error:
        size = Path(path).stat().st_size if Path(path).exists() else 0
        raise CorruptFileError(
            f"{path} is not a readable safetensors file ({error}; {size} bytes): it is probably truncated by an "
            "interrupted copy or download; copy or save it again",
            path=path,
        ) from None
    except FileNotFoundError:
        raise MissingInputError(f"{path} does not exist", path=path) from None
    with handle:
        yield handle


def read_index(path: str | Path) -> dict[str, str]:
    """The `weight_map` (tensor name -> shard file) of a `model.safetensors.index.json`, refusing a broken one."""
    try:
        weight_map = json.loads(Path(path).read_text())["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
        reason = "has no 'weight_map'" if isinstance(error, (KeyError, TypeError)) else f"is not valid JSON ({error})"
        raise CorruptFileError(f"the shard index {path} {reason}", path=path) from None
    if not isinstance(weight_map, dict):
        raise CorruptFileError(f"the shard index {path}: 'weight_map' is not a mapping", path=path)
    return dict(weight_map)


class TensorReader:
    """Lazy access to the tensors of a safetensors checkpoint directory (or a single .safetensors file)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if path.is_file():
            self.directory, files = path.parent, [path.name]
            self._file_of = None
        elif (path / INDEX_FILE).exists():
            self.directory = path
            self._file_of = read_index(path / INDEX_FILE)
            files = sorted(set(self._file_of.values()))
            missing = [file for file in files if not (path / file).is_file()]
            if missing:
                raise MissingInputError(
                    f"{path / INDEX_FILE} lists shard {missing[0]}, which is not in {path}"
                    + (f" ({len(missing)} shards missing)" if len(missing) > 1 else ""),
                    path=path / missing[0],
                )
        elif (path / SINGLE_FILE).exists():
            self.directory, files, self._file_of = path, [SINGLE_FILE], None
        else:
            raise MissingInputError(f"{path} holds neither {SINGLE_FILE} nor {INDEX_FILE}", path=path)
        self.files = files
        if self._file_of is None:
            self._file_of = {}
            for file in files:
                with open_safetensors(self.directory / file) as handle:
                    self._file_of.update(dict.fromkeys(handle.keys(), file))

    def names(self) -> list[str]:
        return sorted(self._file_of)

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def _file(self, name: str) -> Path:
        if name not in self._file_of:
            raise KeyError(f"tensor {name!r} is not in {self.directory}")
        return self.directory / self._file_of[name]

    def get(self, name: str) -> torch.Tensor:
        with open_safetensors(self._file(name)) as handle:
            return handle.get_tensor(name)

    def shape_and_dtype(self, name: str) -> tuple[tuple[int, ...], str]:
        """Shape and safetensors dtype string ("F32", "BF16", ...) read from the header only."""
        with open_safetensors(self._file(name)) as handle:
            view = handle.get_slice(name)
            return tuple(view.get_shape()), view.get_dtype()

    def manifest(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Every tensor's shape and safetensors dtype string, read from the headers (each file opened once)."""
        entries = {}
        for file in self.files:
            with open_safetensors(self.directory / file) as handle:
                for name in sorted(handle.keys()):
                    view = handle.get_slice(name)
                    entries[name] = (tuple(view.get_shape()), view.get_dtype())
        return dict(sorted(entries.items()))

    def metadata(self) -> dict[str, str]:
        """The string metadata stored in the first file's header (where kinfolk records provenance)."""
        with open_safetensors(self.directory / self.files[0]) as handle:
            return dict(handle.metadata() or {})

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Tensors in name order, one at a time, each file opened once."""
        for file in self.files:
            with open_safetensors(self.directory / file) as handle:
                for name in sorted(handle.keys()):
                    yield name, handle.get_tensor(name)


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class ShardedWriter:
    """Write tensors into `model-0000i-of-0000n.safetensors` shards plus an index (a single file if one shard)."""

    def __init__(
        self,
        directory: str | Path,
        max_shard_bytes: int = 5 * 1024**3,
        metadata: dict[str, str] | None = None,
        on_shard_written: Callable[[Path], None] | None = None,
    ):
        """`on_shard_written(path)` is called with each shard file as soon as it is written (before the final
        renames), e.g. to start flushing it to disk while the next shard is computed."""
        self.directory = Path(directory)
        self.on_shard_written = on_shard_written
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_shard_bytes = max_shard_bytes
        self.metadata = {"format": "pt", **(metadata or {})}
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._shards: list[tuple[str, list[str], int]] = []  # (temporary file name, tensor names, bytes)
        self._seen: set[str] = set()

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self._seen:
            raise ValueError(f"tensor {name!r} was added twice")
        self._seen.add(name)
        size = tensor_bytes(tensor)
        self.make_room(size)
        # safetensors refuses views that share storage; a contiguous copy is at most this one tensor.
        self._pending[name] = tensor.detach().contiguous()
        self._pending_bytes += size

    def make_room(self, nbytes: int) -> None:
        """Write the pending shard now if a tensor of `nbytes` would not fit in it.

        Callers that compute tensors one by one call this before building the next one, so the pending shard
        and that tensor's inputs are never held together beyond `max_shard_bytes` plus the tensor's own needs.
        """
        if self._pending and self._pending_bytes + nbytes > self.max_shard_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        temporary = f"shard-{len(self._shards):05d}.safetensors"
        save_file(self._pending, self.directory / temporary, metadata=self.metadata)
        if self.on_shard_written is not None:
            self.on_shard_written(self.directory / temporary)
        self._shards.append((temporary, list(self._pending), self._pending_bytes))
        self._pending, self._pending_bytes = {}, 0

    def close(self) -> list[Path]:
        """Write the last shard, give the shards their final names and write the index; returns the files."""
        self._flush()
        count = len(self._shards)
        if count == 0:
            save_file({}, self.directory / SINGLE_FILE, metadata=self.metadata)
            return [self.directory / SINGLE_FILE]
        if count == 1:
            (self.directory / self._shards[0][0]).rename(self.directory / SINGLE_FILE)
            return [self.directory / SINGLE_FILE]
        weight_map, files = {}, []
        for position, (temporary, names, _) in enumerate(self._shards, start=1):
            final = f"model-{position:05d}-of-{count:05d}.safetensors"
            (self.directory / temporary).rename(self.directory / final)
            weight_map.update(dict.fromkeys(names, final))
            files.append(self.directory / final)
        index = {
            "metadata": {"total_size": sum(size for *_, size in self._shards)},
            "weight_map": dict(sorted(weight_map.items())),
        }
        (self.directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        return files

    def __enter__(self) -> ShardedWriter:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.close()
