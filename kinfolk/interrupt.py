"""SIGTERM (what a scheduler sends before it kills a job) and SIGINT (Ctrl-C) in a long verb: stop at once, say
in one line what is kept and the command that resumes, exit 128 + the signal (130 for SIGINT, 143 for SIGTERM).

Stopping at once is safe because every kinfolk output is whole or absent (`kinfolk.atomic`): the signal raises
`Interrupted` (a `KeyboardInterrupt`, so no `except Exception` swallows it) in the main thread, the `finally`
blocks remove the staging, and what stays on disk is exactly what a rerun uses (the score cache's chunks, the
lab's trained models and finished families, the trainers' published checkpoints). Further signals while that
cleanup runs are ignored. A verb states what its interruption keeps with `keep(...)` before its long work;
`kinfolk.commands.run` installs the handlers (`catch_signals`) and prints the line (`interrupted_line`), which
names the run's side log when one was opened (`kinfolk.console.quiet` reports it with `log_to`): what the
libraries said before the signal is there. A verb that runs `accelerate launch` (`kinfolk sft`, `kinfolk distil`)
prints the same line under every accelerate of the tested window: from 1.16 the launcher handles the signal itself
and exits, and `kinfolk.compat.accelerate` turns that exit back into `Interrupted`.

>>> start_run()  # what `kinfolk.commands.run` does first: no earlier verb's keep or log
>>> keep("the score cache: every chunk scored so far")
>>> interrupted_line("kinfolk score", Interrupted(15), ["score", "--data", "d.jsonl", "--out", "s.jsonl"])
'kinfolk score: stopped by SIGTERM; kept: the score cache: every chunk scored so far; resume: kinfolk score --data d.jsonl --out s.jsonl'
>>> log_to("s.run.log")
>>> interrupted_line("kinfolk score", Interrupted(15), ["score"]).split("; ")[2:]
['log: s.run.log', 'resume: kinfolk score']
>>> start_run()
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

SIGNALS = (signal.SIGINT, signal.SIGTERM)
LAUNCHED_ENV = "KINFOLK_LAUNCHED"  # set in the processes `accelerate launch` starts for a verb
NOTHING_PARTIAL = "nothing partial (every output is whole or absent; a rerun starts this step again)"


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; `signum` says which, `exit_code` is the shell's 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@dataclass
class _Kept:
    """What the running verb's interruption leaves for a rerun, and how its resume command differs from its own."""

    description: str = NOTHING_PARTIAL
    resume: Callable[[list[str]], list[str]] | None = None
    log: Path | None = None  # the side log the verb opened, if any


_kept = _Kept()


def start_run() -> None:
    """Forget what an earlier verb in this process declared: nothing is kept and no log is open yet."""
    _kept.description, _kept.resume, _kept.log = NOTHING_PARTIAL, None, None


def log_to(path: str | Path) -> None:
    """Name the running verb's side log in its interruption line (`kinfolk.console.quiet` calls this)."""
    _kept.log = Path(path)


def keep(description: str, resume: Callable[[list[str]], list[str]] | None = None) -> None:
    """Declare what an interruption of this verb keeps; `resume(argv)` turns its arguments into the rerun's (e.g.
    adds `--overwrite` where the output directory the run created must be reused), the same arguments if None."""
    _kept.description, _kept.resume = description, resume


def with_flag(flag: str) -> Callable[[list[str]], list[str]]:
    """A `resume` for `keep`: the same arguments with `flag` added where it is missing."""
    return lambda argv: argv if flag in argv else [*argv, flag]


def without_flag(flag: str) -> Callable[[list[str]], list[str]]:
    """A `resume` for `keep`: the same arguments without `flag` (e.g. `--overwrite` that would start over)."""
    return lambda argv: [argument for argument in argv if argument != flag]


def interrupted_line(prog: str, error: KeyboardInterrupt, argv: list[str]) -> str:
    """The one line an interrupted verb prints: the signal, what is kept and the command that resumes."""
    name = signal.Signals(getattr(error, "signum", signal.SIGINT)).name
    rerun = _kept.resume(list(argv)) if _kept.resume else list(argv)
    log = f"; log: {_kept.log}" if _kept.log is not None else ""  # before the command, which stays last to copy
    return f"{prog}: stopped by {name}; kept: {_kept.description}{log}; resume: kinfolk {shlex.join(rerun)}"


def exit_code(error: KeyboardInterrupt) -> int:
    """130 for Ctrl-C (a plain `KeyboardInterrupt` too), 143 for SIGTERM."""
    return error.exit_code if isinstance(error, Interrupted) else 128 + signal.SIGINT


@contextlib.contextmanager
def catch_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise `Interrupted` once in the main thread; later ones are ignored
    (so the cleanup of the first runs to its end). Outside the main thread this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def interrupt(signum: int, frame) -> None:
        nonlocal raised
        if not raised:
            raised = True
            raise Interrupted(signum)

    previous = {number: signal.signal(number, interrupt) for number in SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
