"""What a long verb shows on the terminal: one line per stage, one progress bar at a time, the warnings that matter
once, and its result; the libraries' chatter goes to a log file.

Inside `quiet(log_path, prog)` everything written to standard output and error goes to `log_path`: at the file
descriptor level (so subprocesses such as `accelerate launch` and C extensions too), `sys.stdout` / `sys.stderr`,
the logging handlers that wrote there (transformers', lm-eval's, datasets'), Python warnings, the Trainer's
`{'loss': ...}` dictionaries and the libraries' own tqdm bars; the libraries' root loggers (`LIBRARY_LOGGERS`)
lose their handlers and propagate to the log. datasets' and the Hub's progress bars are switched off for the
block, and so is every tqdm bar of a process started inside it (`TQDM_DISABLE`: tqdm reads it at import). Only
this module writes to the terminal:

- `stage(message)`: one line `[prog 12.3s] message`, wrapped to 100 columns (also in the log);
- `bar(...)`: a tqdm bar on the terminal, at most 100 columns, gone when it closes (one bar at a time);
- `show(text)`: the result (the headline, where the output is) on standard output;
- a warning from kinfolk itself (`warnings.warn` in a kinfolk module, or a `kinfolk.*` logger at WARNING and
  above) once per message, whole (wrapped like a stage line: the file it names is never cut), with the rest in
  the log.

The log is opened only when the block starts: a verb checks its outputs first (`kinfolk.atomic.check_destination`),
so a refused run never creates it, and names it in an interruption line (`kinfolk.interrupt.log_to`).

With `verbose=True` nothing is redirected (the libraries print as they do without kinfolk) and the stage lines
still appear. Outside any `quiet` block the helpers print to the process's own streams, so library code can call
them unconditionally.

>>> import io, pathlib, tempfile
>>> terminal = io.StringIO()
>>> log = pathlib.Path(tempfile.mkdtemp()) / "run.log"
>>> with quiet(log, "kinfolk demo", terminal=terminal):
...     print("{'loss': 1.25}")   # library chatter
...     show("done: report.md")
>>> terminal.getvalue(), "'loss'" in log.read_text()
('done: report.md\\n', True)
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from kinfolk.atomic import check_writable
from kinfolk.errors import InputError
from kinfolk.interrupt import log_to

WIDTH = 100
LIBRARY_LOGGERS = ("transformers", "datasets", "lm_eval", "lm-eval", "accelerate", "huggingface_hub", "trl", "peft")
LOG_FILE = "run.log"
_QUIET_ENVIRONMENT = {
    "TQDM_DISABLE": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}
# where kinfolk's own warnings come from: the package and its subpackages mapped from other folders
_KINFOLK_ROOTS = tuple(
    str(Path(location).resolve())
    for name in ("kinfolk", "kinfolk.plugins", "kinfolk.trainers", "kinfolk.callbacks")
    if (spec := importlib.util.find_spec(name)) is not None
    for location in spec.submodule_search_locations or []
)


class Console:
    """The terminal streams of a verb and its log; see the module docstring."""

    def __init__(self, prog: str, out: TextIO, err: TextIO, log: TextIO | None):
        self.prog, self.out, self.err, self.log = prog, out, err, log
        self.start = time.perf_counter()
        self._warned: set[str] = set()

    def _write(self, stream: TextIO, text: str) -> None:
        stream.write(text + "\n")
        stream.flush()
        if self.log is not None and stream is not self.log:
            self.log.write(text + "\n")
            self.log.flush()

    def _wrapped(self, prefix: str, message: str) -> None:
        lines = textwrap.wrap(
            message,
            WIDTH,
            initial_indent=prefix,
            subsequent_indent=" " * 4,
            break_long_words=False,  # a path stays whole (and copyable), even where it overflows
            break_on_hyphens=False,
        ) or [prefix]
        self._write(self.err, "\n".join(lines))

    def stage(self, message: str) -> None:
        self._wrapped(f"[{self.prog} {time.perf_counter() - self.start:6.1f}s] ", message)

    def show(self, text: str) -> None:
        """`text` as given (results such as tables are laid out to fit by whoever writes them)."""
        self._write(self.out, text)

    def warn_once(self, message: str) -> None:
        first_line = message.strip().splitlines()[0] if message.strip() else message
        if first_line not in self._warned:
            self._warned.add(first_line)
            self._wrapped("warning: ", first_line)

    def bar(self, **kwargs: Any):
        from tqdm.auto import tqdm

        kwargs.setdefault("leave", False)
        return tqdm(file=self.err, ncols=WIDTH, mininterval=0.5, **_on_terminals_only(kwargs))


_active: list[Console] = []


def active() -> Console | None:
    return _active[-1] if _active else None


def stage(message: str, label: str | None = None) -> None:
    """A stage line on the active console's terminal (outside `quiet`: on stderr, as `[label] message`)."""
    console = active()
    if console is None:
        print(f"[{label}] {message}" if label else message, file=sys.stderr, flush=True)
    else:
        console.stage(message)


def show(text: str) -> None:
    """A verb's result on the terminal's standard output (outside `quiet`: `print`)."""
    console = active()
    if console is None:
        print(text, flush=True)
    else:
        console.show(text)


def bar(**kwargs: Any):
    """A tqdm progress bar on the terminal (tqdm's keyword arguments; `disable` is always passed explicitly, so
    the `TQDM_DISABLE` that silences library bars inside `quiet` leaves it on)."""
    console = active()
    kwargs.setdefault("disable", False)
    if console is None:
        from tqdm.auto import tqdm

        return tqdm(**_on_terminals_only(kwargs))
    return console.bar(**kwargs)


def _on_terminals_only(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A bar the caller did not disable is drawn only where its stream is a terminal (tqdm's `disable=None`):
    redrawn with `\r` into a file (`make demo > log`) it left lines of thousands of characters."""
    return {**kwargs, "disable": True if kwargs.get("disable") else None}


class _KinfolkWarnings(logging.Handler):
    """kinfolk's own WARNING records, once each, on the terminal."""

    def __init__(self, console: Console):
        super().__init__(logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        self.console.warn_once(record.getMessage())


def _terminal(stream: TextIO, descriptor: int) -> tuple[TextIO, bool]:
    """A stream that still reaches the terminal after `descriptor` is redirected: a duplicate of the descriptor
    when `stream` writes to it, else `stream` itself (e.g. a test's StringIO); and whether it was opened here."""
    try:
        if stream.fileno() == descriptor:
            return os.fdopen(os.dup(descriptor), "w", buffering=1, encoding="utf-8", errors="replace"), True
    except (AttributeError, OSError, io.UnsupportedOperation, ValueError):
        pass
    return stream, False


def _redirect_handlers(old: tuple[Any, ...], new: Any) -> list[tuple[logging.StreamHandler, Any]]:
    """Point every logging StreamHandler that writes to one of `old` at `new`; returns what to undo."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    changed = []
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            is_stream = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            if is_stream and any(handler.stream is stream for stream in old):
                previous = handler.stream
                with contextlib.suppress(AttributeError):  # handlers whose stream is a read-only property
                    handler.setStream(new)
                    changed.append((handler, previous))
    return changed


def _route_library_loggers() -> list[tuple[logging.Logger, list[logging.Handler], bool]]:
    """The libraries' root loggers lose their own handlers and propagate to the root logger (the log) instead,
    as `transformers.utils.logging.disable_default_handler` + `enable_propagation` do; returns what to restore."""
    saved = []
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, list(logger.handlers), logger.propagate))
        logger.handlers, logger.propagate = [], True
    return saved


def _library_progress_bars(enabled: bool) -> None:
    """datasets' and the Hub's own switches (they read the environment only at import)."""
    with contextlib.suppress(ImportError):
        import datasets

        datasets.enable_progress_bars() if enabled else datasets.disable_progress_bars()
    with contextlib.suppress(ImportError):
        import huggingface_hub.utils as hub

        hub.enable_progress_bars() if enabled else hub.disable_progress_bars()


@contextlib.contextmanager
def quiet(
    log_path: str | Path,
    prog: str,
    verbose: bool = False,
    terminal: TextIO | None = None,
    terminal_err: TextIO | None = None,
) -> Iterator[Console]:
    """Route the libraries' output to `log_path` (appended) for the block; the terminal gets only this module's
    lines. `terminal` / `terminal_err` replace the process's stdout / stderr as the terminal (tests).

    A log this block created is removed again when the block ends in bad input (`InputError`): a refused run
    leaves nothing behind.
    """
    if verbose:
        console = Console(prog, terminal or sys.stdout, terminal_err or terminal or sys.stderr, None)
        _active.append(console)
        try:
            yield console
        finally:
            _active.pop()
        return
    log_path = Path(log_path)
    created = not log_path.exists()
    try:
        with _routed(log_path, prog, terminal, terminal_err) as console:
            yield console
    except InputError:
        if created:
            log_path.unlink(missing_ok=True)
        raise


def log_beside(out: str | Path) -> Path:
    """Where the log of a verb whose output `out` (a file or a directory) appears whole or not at all goes: beside
    it, `NAME.run.log` for `NAME.jsonl` or `NAME/`."""
    out = Path(out)
    return out.with_name(f"{out.stem if out.suffix else out.name}.run.log")


@contextlib.contextmanager
def _routed(log_path: Path, prog: str, terminal: TextIO | None, terminal_err: TextIO | None) -> Iterator[Console]:
    check_writable(log_path)  # the verb checked its outputs; a log elsewhere is refused by name, not a traceback
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_to(log_path)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with open(log_path, "a", buffering=1, encoding="utf-8", errors="replace") as log:
        out, own_out = (terminal, False) if terminal is not None else _terminal(sys.stdout, 1)
        err, own_err = (terminal_err or terminal, False) if terminal is not None else _terminal(sys.stderr, 2)
        saved_descriptors = [os.dup(1), os.dup(2)]
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        saved_streams = (sys.stdout, sys.stderr)
        originals = (*saved_streams, sys.__stdout__, sys.__stderr__)
        sys.stdout = sys.stderr = log
        handlers = _redirect_handlers(originals, log)
        library_loggers = _route_library_loggers()
        saved_environment = {name: os.environ.get(name) for name in _QUIET_ENVIRONMENT}
        os.environ.update(_QUIET_ENVIRONMENT)
        _library_progress_bars(False)
        console = Console(prog, out, err, log)
        kinfolk_logger = logging.getLogger("kinfolk")
        saved_level = kinfolk_logger.level
        warning_handler, log_handler = _KinfolkWarnings(console), logging.StreamHandler(log)
        log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        kinfolk_logger.addHandler(warning_handler)
        kinfolk_logger.setLevel(logging.INFO)
        logging.getLogger().addHandler(log_handler)
        saved_showwarning = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None) -> None:
            log.write(warnings.formatwarning(message, category, filename, lineno, line))
            if str(Path(filename).resolve()).startswith(_KINFOLK_ROOTS):
                console.warn_once(str(message))

        warnings.showwarning = showwarning
        _active.append(console)
        try:
            yield console
        finally:
            _active.pop()
            warnings.showwarning = saved_showwarning
            logging.getLogger().removeHandler(log_handler)
            kinfolk_logger.removeHandler(warning_handler)
            kinfolk_logger.setLevel(saved_level)
            for name, value in saved_environment.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            if saved_environment["HF_DATASETS_DISABLE_PROGRESS_BARS"] is None:
                _library_progress_bars(True)
            for logger, own_handlers, propagate in library_loggers:
                logger.handlers = own_handlers + [h for h in logger.handlers if h not in own_handlers]
                logger.propagate = propagate
            for handler, stream in handlers:
                handler.setStream(stream)
            _redirect_handlers((log,), saved_streams[1])  # handlers libraries created inside the block
            sys.stdout, sys.stderr = saved_streams
            for descriptor, saved in zip((1, 2), saved_descriptors, strict=True):
                os.dup2(saved, descriptor)
                os.close(saved)
            for stream, owned in ((out, own_out), (err, own_err)):
                if owned:
                    stream.close()
