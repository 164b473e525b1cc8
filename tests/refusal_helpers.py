"""What every refusal of bad input must show: the specific error, one line naming the culprit, nothing written at
the destination (or beside it) and the inputs untouched."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest


def snapshot(paths: Iterable[str | Path]) -> dict[str, str]:
    """sha256 of every file under each path (a file or a directory)."""
    digests = {}
    for root in map(Path, paths):
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            digests[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def assert_refused(
    call: Callable[[], object],
    error: type[BaseException],
    *named: object,
    destination: str | Path | None = None,
    inputs: Iterable[str | Path] = (),
) -> BaseException:
    """Run `call`, expecting `error` whose one-line message names each of `named`; returns the error."""
    inputs = list(inputs)
    before = snapshot(inputs)
    with pytest.raises(error) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message, message
    for name in named:
        assert str(name) in message, f"{name!r} not named in: {message}"
    if destination is not None:
        destination = Path(destination)
        assert not destination.exists(), f"{destination} was written"
        siblings = (
            [p.name for p in destination.parent.glob(f".{destination.name}.*")] if destination.parent.exists() else []
        )
        assert siblings == [], f"left beside the destination: {siblings}"
    assert snapshot(inputs) == before, "an input was modified"
    return caught.value
