"""What every refusal of bad input must show: the specific error (exit 2 from the command line), one line naming the
culprit and no traceback, nothing written at the destination (or beside it) and the inputs untouched."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
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
    _assert_nothing_at(destination)
    assert snapshot(inputs) == before, "an input was modified"
    return caught.value


def _assert_nothing_at(destination: str | Path | None) -> None:
    if destination is None:
        return
    destination = Path(destination)
    assert not destination.exists(), f"{destination} was written"
    siblings = (
        [p.name for p in destination.parent.glob(f".{destination.name}.*")] if destination.parent.exists() else []
    )
    assert siblings == [], f"left beside the destination: {siblings}"


def assert_command_refused(
    argv: list[object],
    *named: object,
    destination: str | Path | None = None,
    inputs: Iterable[str | Path] = (),
    run: Callable[[list[str]], int] | None = None,
    beside: Iterable[str | Path] = (),
) -> str:
    """Run `kinfolk ARGV` in this process (or `run(argv)`), expecting exit 2 and, on stderr, one line
    `kinfolk VERB: error: ...` naming each of `named` and no traceback; nothing written at (or beside) the
    destination, none of the side files `beside` (a side log, a report) created and the inputs untouched. Returns
    the error line."""
    from kinfolk.commands import main

    argv = [str(argument) for argument in argv]
    inputs = list(inputs)
    before = snapshot(inputs)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            status = (run or main)(argv)
        except SystemExit as exit_:  # the option parser's usage errors
            status = exit_.code
    text = stderr.getvalue()
    assert status == 2, f"exit {status}: {text[-2000:]}"
    assert "Traceback" not in text, text
    # the verb's own prefix, or a sub-command's (`kinfolk lab experiment atlantis: error: ...`)
    errors = [line for line in text.splitlines() if re.match(rf"kinfolk {argv[0]}( [\w-]+)*: error: ", line)]
    assert len(errors) == 1, text
    assert text.rstrip().splitlines()[-1] == errors[0], text  # the error is the last word
    for name in named:
        assert str(name) in errors[0], f"{name!r} not named in: {errors[0]}"
    _assert_nothing_at(destination)
    created = [str(path) for path in beside if Path(path).exists()]
    assert created == [], f"side files created: {created}"
    assert snapshot(inputs) == before, "an input was modified"
    return errors[0]


def write_lines(path: Path, lines: Iterable[str | dict]) -> Path:
    """Write `lines` to `path` as they are (a string: the line's text, its newline included) or as JSON (a record,
    no newline: a file's malformed last line)."""
    path.write_text("".join(line if isinstance(line, str) else json.dumps(line) for line in lines))
    return path
