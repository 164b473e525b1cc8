"""Runs shared by processes started alike: each claims a run's folder before making it, and skips one a live
process holds, so two one-thread processes use two cores without repeating work or racing on a folder.

>>> import tempfile
>>> where = Path(tempfile.mkdtemp())
>>> with claimed(where) as ours, claimed(where) as again:
...     ours, again
(True, False)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from kinfolk.atomic import Writer, current_writer

K = TypeVar("K")
CLAIM_FILE = "claimed-by"  # in the claimed folder: the holder (`kinfolk.atomic.Writer`) as JSON


@contextlib.contextmanager
def claimed(where: Path) -> Iterator[bool]:
    """Claim the run folder `where` for this process (True) unless a live process holds it (False); a claim left
    by a process that died is taken over (`kinfolk.atomic.Writer`: host, boot and start time, so a reused process
    id is not mistaken for the holder). The claim is released when the block ends."""
    where.mkdir(parents=True, exist_ok=True)
    claim = where / CLAIM_FILE
    try:
        handle = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            holder = Writer(**json.loads(claim.read_text()))
        except ValueError:  # empty or half-written: its holder is writing it right now
            holder = None
        if holder is None or holder.is_alive() is not False:  # alive, or another host's
            yield False
            return
        claim.unlink(missing_ok=True)
        with claimed(where) as ours:
            yield ours
        return
    os.write(handle, json.dumps(dataclasses.asdict(current_writer())).encode())
    os.close(handle)
    try:
        yield True
    finally:
        claim.unlink(missing_ok=True)


def until_made(make: Callable[[K], object | None], keys: list[K], wait_seconds: float = 20.0) -> None:
    """Call `make(key)` for every key until none answers None (None: part of it is another process's), waiting
    between passes that left some: each pass makes what no live process holds."""
    from kinfolk import console

    pending = list(keys)
    while pending:
        pending = [key for key in pending if make(key) is None]
        if pending:
            console.stage(f"{len(pending)} wait on another process's work")
            time.sleep(wait_seconds)
