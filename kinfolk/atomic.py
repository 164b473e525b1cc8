"""Outputs that appear whole or not at all, and fingerprints of inputs.

Every kinfolk verb that writes builds its output beside the destination (a hidden temporary sibling on the
same file system), fsyncs it and renames it into place, so an interrupted run never leaves a half-written
result where a user or a later stage would read it.

>>> import json, tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> with atomic_directory(root / "out") as tmp:
...     _ = (tmp / "result.json").write_text(json.dumps({"ok": True}))
>>> json.loads((root / "out" / "result.json").read_text())
{'ok': True}
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kinfolk.errors import InputError


class OutputExistsError(InputError, FileExistsError):
    """The destination exists and the caller did not ask to overwrite it."""


def _temporary_sibling(destination: Path, tag: str) -> Path:
    return destination.with_name(f".{destination.name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_directory(root)


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems refuse fsync on directories
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def check_destination(destination: str | Path, overwrite: bool) -> Path:
    """Refuse an existing destination unless `overwrite`; call before long work so the user learns early."""
    destination = Path(destination)
    if destination.exists() and not overwrite:
        raise OutputExistsError(f"{destination} already exists; pass --overwrite (overwrite=True) to replace it")
    return destination


@contextlib.contextmanager
def atomic_directory(destination: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory that replaces `destination` only if the block finishes without error."""
    destination = check_destination(destination, overwrite)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = _temporary_sibling(destination, "tmp")
    staging.mkdir()
    try:
        yield staging
        _fsync_tree(staging)
        if destination.exists():
            retired = _temporary_sibling(destination, "old")
            destination.rename(retired)
            staging.rename(destination)
            shutil.rmtree(retired) if retired.is_dir() else retired.unlink()
        else:
            staging.rename(destination)
        _fsync_directory(destination.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_file(destination: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[Any]:
    """Open a temporary sibling for writing; it replaces `destination` (always overwriting) when the block ends."""
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = _temporary_sibling(destination, "tmp")
    kwargs = {} if "b" in mode else {"encoding": encoding}
    try:
        with open(staging, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, destination)
        _fsync_directory(destination.parent)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def write_json(destination: str | Path, payload: Any, indent: int = 2) -> Path:
    """Atomically write `payload` as JSON (keys kept in insertion order, non-JSON values via `str`)."""
    with atomic_file(destination) as handle:
        json.dump(payload, handle, indent=indent, default=str)
        handle.write("\n")
    return Path(destination)


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-serialisable parts (configs, options, file hashes) for cache keys."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
        digest.update(b"\x00")
    return digest.hexdigest()[:16]


def _new_digest(algorithm: str):
    if algorithm == "xxh3_128":  # ~10x faster than sha256: for fingerprinting multi-GB checkpoints
        import xxhash

        return xxhash.xxh3_128()
    return hashlib.new(algorithm)


def file_digest(path: str | Path, algorithm: str = "sha256", chunk_bytes: int = 1 << 26) -> str:
    """Hex digest of a file's contents; `algorithm` is a hashlib name or "xxh3_128".

    The file is read through memory-mapped windows of `chunk_bytes` (no copy out of the page cache, and at most
    one window resident at a time).
    """
    digest = _new_digest(algorithm)
    chunk_bytes = max(mmap.ALLOCATIONGRANULARITY, chunk_bytes - chunk_bytes % mmap.ALLOCATIONGRANULARITY)
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        for offset in range(0, size, chunk_bytes):
            length = min(chunk_bytes, size - offset)
            with mmap.mmap(handle.fileno(), length, access=mmap.ACCESS_READ, offset=offset) as window:
                digest.update(window)
    return digest.hexdigest()


def file_sha256(path: str | Path, chunk_bytes: int = 1 << 22) -> str:
    return file_digest(path, "sha256", chunk_bytes)


def directory_fingerprint(
    directory: str | Path, patterns: tuple[str, ...] = ("*.json", "*.safetensors"), algorithm: str = "sha256"
) -> str:
    """Hash of the matching files' names and contents: identifies a saved model or dataset for provenance."""
    directory = Path(directory)
    entries = sorted(path for pattern in patterns for path in directory.glob(pattern) if path.is_file())
    return fingerprint([(path.name, file_digest(path, algorithm)) for path in entries])
