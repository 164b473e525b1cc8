"""Free disk space: refuse a write the destination's file system cannot hold before any work, and name the
destination in one line when the disk fills anyway (another writer took the space).

`check_free_space(destination, needed)` is the pre-flight: it reads the free bytes of the file system the
destination will be created on (its nearest existing ancestor) and raises `NotEnoughSpaceError` (bad input: exit 2,
one line with the destination, the bytes needed and the bytes free) when they do not suffice. The verbs call it
with their plan's output size (merges) or an estimate (the score output and cache, distillation, the lab's cache).

`disk_full_names(destination)` wraps a write: `ENOSPC` / `EDQUOT` from anywhere inside (Python's `OSError`, or the
text "No space left on device (os error 28)" that safetensors' Rust writer raises) becomes `DiskFullError`, a
runtime failure the command line prints as one line (exit 1). `kinfolk.atomic.atomic_directory` and `atomic_file`
wrap every write with it, so the staging is removed and nothing appears at the destination.

>>> import tempfile
>>> check_free_space(tempfile.gettempdir(), 1)
>>> format_bytes(14_600_000), format_bytes(512)
('14.6 MB', '512 B')
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

from kinfolk.errors import NotEnoughSpaceError

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_FULL_TEXTS = ("no space left on device", "os error 28", "disk quota exceeded")


class DiskFullError(OSError):
    """The disk filled during a write (not bad input: the pre-flight saw enough space). `path` is the destination."""

    def __init__(self, destination: str | Path):
        self.path = str(destination)
        free = free_bytes(destination)
        super().__init__(
            errno.ENOSPC,
            f"no space left on device while writing {destination} ({format_bytes(free)} free now); the partial "
            "output was removed and nothing was written there",
        )

    def __str__(self) -> str:
        return self.strerror


def format_bytes(count: int) -> str:
    """Bytes in decimal units, three significant figures: 14.6 MB, 28.1 GB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(count) >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def existing_ancestor(path: str | Path) -> Path:
    """The nearest existing directory at or above `path`: where its bytes will be counted."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path if path.is_dir() else path.parent


def free_bytes(path: str | Path) -> int:
    """Bytes an unprivileged writer can still use on the file system `path` is (or will be) on."""
    return shutil.disk_usage(existing_ancestor(path)).free


def path_bytes(path: str | Path) -> int:
    """Bytes of a file, or of every file under a directory (0 where `path` does not exist, e.g. a Hub name)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())
    return 0


def check_free_space(destination: str | Path, needed: int, what: str = "") -> None:
    """Refuse (`NotEnoughSpaceError`) when `destination`'s file system has fewer than `needed` bytes free.

    `what` says in the message what the bytes are for ("6 patched sizes", "the score cache").
    """
    free = free_bytes(destination)
    if needed > free:
        detail = f" for {what}" if what else ""
        raise NotEnoughSpaceError(
            f"not enough disk space for {destination}: needs {format_bytes(needed)}{detail}, "
            f"{format_bytes(free)} free on {existing_ancestor(destination)}",
            path=destination,
        )


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` (or an error it was raised from) says the disk or the quota is full."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _FULL_ERRNOS:
            return True
        if any(text in str(error).lower() for text in _FULL_TEXTS):
            return True
        error = error.__cause__ or error.__context__
    return False


@contextlib.contextmanager
def disk_full_names(destination: str | Path) -> Iterator[None]:
    """Re-raise a full disk inside the block as `DiskFullError(destination)`; other errors pass unchanged.

    Nested writes (a file inside a staging directory) are renamed by each level, so the outermost destination,
    the one the user named, is the one the message gives.
    """
    try:
        yield
    except Exception as error:
        if is_disk_full(error):
            raise DiskFullError(destination) from error
        raise
