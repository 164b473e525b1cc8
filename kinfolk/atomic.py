"""Outputs that appear whole or not at all, staging that a later run can clean up, and fingerprints of inputs.

Every kinfolk verb that writes builds its output beside the destination (a hidden staging sibling on the same
file system), fsyncs it and renames it into place, so an interrupted run never leaves a half-written result where
a user or a later stage would read it. The guarantees (docs/reliability.md):

- Whole or absent: the destination is only ever reached by a rename of a complete, fsynced staging sibling.
- Overwrite keeps a whole output at every instant: replacing an existing directory swaps old and new in one
  atomic exchange (Linux `renameat2(RENAME_EXCHANGE)`, macOS `renamex_np(RENAME_SWAP)`). Where the file system
  or platform has no exchange, the old output is first renamed to a restorable `.NAME.old-...` sibling; if the
  writer dies in that short window, the next run to the destination renames it back.
- No leftovers: a staging sibling's name records its writer (host, boot, process id and start time:
  `.NAME.tmp-HOST-BOOT-PID-START-RANDOM`), so the next run to the same destination removes the staging of a
  writer that is dead (rebooted host, process gone, or its id reused by another process) and never a live
  writer's. Staging written on another host (a shared file system) is left alone: its writer cannot be checked.

>>> import json, tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> with atomic_directory(root / "out") as tmp:
...     _ = (tmp / "result.json").write_text(json.dumps({"ok": True}))
>>> json.loads((root / "out" / "result.json").read_text())
{'ok': True}
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import hashlib
import json
import logging
import mmap
import os
import re
import shutil
import socket
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kinfolk.diskspace import check_free_space, disk_full_names
from kinfolk.errors import OutputExistsError, OutputNotWritableError, option

logger = logging.getLogger(__name__)

# `tmp`: a writer's staging (or, after an exchange, the old output it is deleting); `old`: an old output moved aside
# by the fallback overwrite, restorable while the destination is missing.
_STAGING = re.compile(
    r"^\.(?P<name>.+)\.(?P<role>tmp|old)-(?P<host>[0-9a-f]{8})-(?P<boot>[0-9a-f]{8})-(?P<pid>\d+)-(?P<start>\d+)"
    r"-[0-9a-f]{8}$"
)
_UNKNOWN = "0" * 8


@dataclass(frozen=True)
class Writer:
    """Who owns a staging sibling: enough to tell, on the same host, whether that process still runs."""

    host: str  # 8 hex digits of the hash of the host name and pid namespace
    boot: str  # 8 hex digits of the kernel's boot id ("00000000" where unknown)
    pid: int
    start: int  # the process's start time in clock ticks since boot (0 where unknown)

    def is_alive(self) -> bool | None:
        """True or False on this host; None (unknown) for a writer on another host."""
        if self.host != _host_tag():
            return None
        if _UNKNOWN not in (self.boot, _boot_tag()) and self.boot != _boot_tag():
            return False  # the host rebooted since: every process of that boot is gone
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # exists, owned by another user
        started = _process_start(self.pid)
        return not (self.start and started and started != self.start)  # a different process reusing the id


@functools.cache
def _host_tag() -> str:
    """Where process ids mean the same processes: the host name and, on Linux, the pid namespace (containers
    that share a file system and a host name still see each other's writers as another host's)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return hashlib.sha256(f"{socket.gethostname()}|{namespace}".encode()).hexdigest()[:8]


@functools.cache
def _boot_tag() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
    except OSError:
        return _UNKNOWN


def _process_start(pid: int) -> int:
    """Start time of process `pid` in clock ticks since boot (Linux /proc; 0 where unavailable)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the command name before ")" may hold spaces


def current_writer() -> Writer:
    return Writer(_host_tag(), _boot_tag(), os.getpid(), _process_start(os.getpid()))


def staging_path(destination: Path, role: str = "tmp") -> Path:
    """A fresh staging sibling of `destination` named after this process (see `clean_dead_staging`)."""
    writer = current_writer()
    tag = f"{writer.host}-{writer.boot}-{writer.pid}-{writer.start}-{uuid.uuid4().hex[:8]}"
    return destination.with_name(f".{destination.name}.{role}-{tag}")


def staging_owner(path: Path) -> tuple[str, str, Writer] | None:
    """(destination name, role, writer) of a staging sibling's name, or None if it is not one."""
    match = _STAGING.match(path.name)
    if match is None:
        return None
    writer = Writer(match["host"], match["boot"], int(match["pid"]), int(match["start"]))
    return match["name"], match["role"], writer


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def clean_dead_staging(directory: str | Path, name: str | None = None) -> list[Path]:
    """Remove the staging siblings in `directory` (of destination `name`, or of any) whose writer is dead.

    An old output that a dead writer's fallback overwrite had moved aside is put back when its destination is
    missing. Each removal is claimed first by renaming the sibling to a staging name of this process, so two
    cleaners never race on one directory and a cleaner killed half way leaves a dead writer's name again.
    Returns the paths removed or restored.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    handled = []
    for path in sorted(directory.iterdir()):
        owner = staging_owner(path)
        if owner is None or (name is not None and owner[0] != name) or owner[2].is_alive() is not False:
            continue
        destination = directory / owner[0]
        if owner[1] == "old" and not destination.exists() and _rename_noreplace(path, destination):
            logger.warning("restored %s from %s, left by an interrupted overwrite", destination, path.name)
            handled.append(path)
            continue
        claimed = staging_path(destination)
        try:
            path.rename(claimed)
        except FileNotFoundError:
            continue  # another run took it
        logger.warning("removing %s, left behind by a writer that died (process %d)", path, owner[2].pid)
        _remove(claimed)
        handled.append(path)
    return handled


# --- atomic exchange -----------------------------------------------------------------------------------------------

_AT_FDCWD = -100
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2  # linux/fs.h
_RENAME_SWAP, _RENAME_EXCL = 2, 4  # macOS sys/stdio.h (renamex_np)
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP}


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None


def _rename_flags(source: Path, target: Path, linux_flag: int, mac_flag: int) -> bool | None:
    """rename(2) with a flag: True if done, None if this platform / file system lacks it; other errors raise."""
    libc = _libc()
    if libc is not None and sys.platform.startswith("linux") and hasattr(libc, "renameat2"):
        result = libc.renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), linux_flag)
    elif libc is not None and sys.platform == "darwin" and hasattr(libc, "renamex_np"):
        result = libc.renamex_np(os.fsencode(source), os.fsencode(target), mac_flag)
    else:
        return None
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return None
    raise OSError(code, os.strerror(code), str(source), None, str(target))


def exchange(first: Path, second: Path) -> bool:
    """Atomically swap two existing paths; False where the platform or file system cannot (nothing changed)."""
    return bool(_rename_flags(first, second, _RENAME_EXCHANGE, _RENAME_SWAP))


def _rename_noreplace(source: Path, target: Path) -> bool:
    """Rename unless `target` exists (atomically where the platform can); False if it exists."""
    try:
        done = _rename_flags(source, target, _RENAME_NOREPLACE, _RENAME_EXCL)
    except FileExistsError:
        return False
    if done is None:
        if target.exists():
            return False
        source.rename(target)
    return True


# --- writing -------------------------------------------------------------------------------------------------------


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
    """Refuse an existing destination unless `overwrite`, and one that cannot be created (`check_writable`); call
    before long work so the user learns early.

    Also removes what dead writers left beside it (so a rerun does not start with their tens of GB still on
    disk) and puts back an old output that an interrupted overwrite had moved aside.
    """
    destination = Path(destination)
    clean_dead_staging(destination.parent, destination.name)
    if destination.exists() and not overwrite:
        raise OutputExistsError(
            f"{destination} already exists; pass {option('overwrite')} to replace it", path=destination
        )
    check_writable(destination)
    return destination


def check_writable(destination: str | Path) -> Path:
    """Refuse a destination that cannot be created: the nearest existing ancestor must be a directory that takes a
    new entry.

    Permission bits say no to most users, but not to root, nor about a read-only mount or a file system such as
    /proc that takes no new files: so an empty staging file of this process is created in that ancestor and
    removed at once (a writer killed in between leaves it under its own, dead, name for `clean_dead_staging`).
    Nothing stays behind.
    """
    destination = Path(destination).absolute()
    ancestor, first_missing = destination.parent, destination
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor, first_missing = ancestor.parent, ancestor
    if not ancestor.is_dir():
        raise OutputNotWritableError(
            f"cannot write {destination}: {ancestor} is a file, not a directory", path=destination
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputNotWritableError(f"cannot write {destination}: {ancestor} is not writable", path=destination)
    probe = staging_path(first_missing)
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as error:
        raise OutputNotWritableError(
            f"cannot write {destination}: {ancestor} takes no new files ({error.strerror})", path=destination
        ) from None
    probe.unlink()
    return destination


@contextlib.contextmanager
def atomic_directory(
    destination: str | Path, overwrite: bool = False, needed_bytes: int | None = None
) -> Iterator[Path]:
    """Yield an empty staging directory that replaces `destination` only if the block finishes without error.

    `needed_bytes`, when known, is checked against the free space first (`kinfolk.diskspace.check_free_space`);
    a disk that fills during the block raises `kinfolk.diskspace.DiskFullError` naming `destination`.
    """
    destination = check_destination(destination, overwrite)
    if needed_bytes is not None:
        check_free_space(destination, needed_bytes)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_path(destination)
    staging.mkdir()
    try:
        with disk_full_names(destination):
            yield staging
            publish(staging, destination)
    finally:  # after an exchange it holds the old output; after a failure, the partial new one
        if staging.exists() or staging.is_symlink():
            _remove(staging)


def publish(staging: Path, destination: Path) -> None:
    """Move a complete staging directory to `destination`, fsynced, replacing an existing one atomically.

    After an exchange `staging` holds the old output, for the caller to remove (a writer killed before it does
    leaves it under its own, dead, name).
    """
    _fsync_tree(staging)
    if not (destination.exists() or destination.is_symlink()):
        staging.rename(destination)
    elif exchange(staging, destination):
        _fsync_directory(destination.parent)  # the swap is durable before the old output goes
    else:
        _replace_in_two_renames(staging, destination)
    _fsync_directory(destination.parent)


def _replace_in_two_renames(staging: Path, destination: Path) -> None:
    """The fallback overwrite: move the old output aside under a restorable name, then the new one into place."""
    retired = staging_path(destination, "old")
    destination.rename(retired)
    try:
        staging.rename(destination)
    except BaseException:
        retired.rename(destination)
        raise
    _fsync_directory(destination.parent)
    _remove(retired)


@contextlib.contextmanager
def atomic_file(
    destination: str | Path, mode: str = "w", encoding: str | None = "utf-8", clean: bool = True
) -> Iterator[Any]:
    """Open a staging sibling for writing; it replaces `destination` (always overwriting) when the block ends.

    `clean=False` skips looking for dead writers' staging of this destination (for callers that write many files
    into one directory and clean it once, such as the score cache).
    """
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    if clean:
        clean_dead_staging(destination.parent, destination.name)
    staging = staging_path(destination)
    kwargs = {} if "b" in mode else {"encoding": encoding}
    try:
        with disk_full_names(destination), open(staging, mode, **kwargs) as handle:
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
