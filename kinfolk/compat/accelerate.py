"""accelerate inside kinfolk's tested window: how `accelerate launch` ends when the launcher is signalled.

Up to 1.15 the simple launcher only waits for its child: SIGINT / SIGTERM reach kinfolk's own handler
(`kinfolk.interrupt.catch_signals`), which raises `Interrupted` out of `launch_command`. From 1.16
(`accelerate.commands.launch._run_subprocess`, and `_run_torchrun` for several processes) the launcher handles the
signal itself: it installs its own SIGTERM handler for the wait, catches the `KeyboardInterrupt` that SIGINT raises,
stops the child's whole process tree (SIGTERM, then SIGKILL after 5 s) and ends with `sys.exit(128 + signum)`.
`launcher_signal` turns that exit back into the signal, so the verb still says what it kept and how to resume.

>>> import signal
>>> launcher_signal(SystemExit(143), since=True) == signal.SIGTERM, launcher_signal(SystemExit(130), since=True)
(True, <Signals.SIGINT: 2>)
>>> launcher_signal(SystemExit(1), since=True), launcher_signal(SystemExit(143), since=False)
(None, None)
"""

from __future__ import annotations

import signal

from kinfolk.compat import at_least, warn_about_versions_outside_window

warn_about_versions_outside_window()

LAUNCHER_HANDLES_SIGNALS_SINCE = "1.16.0"
LAUNCHER_HANDLES_SIGNALS = at_least("accelerate", LAUNCHER_HANDLES_SIGNALS_SINCE)
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def launcher_signal(exit: SystemExit, since: bool = LAUNCHER_HANDLES_SIGNALS) -> signal.Signals | None:
    """The signal an `accelerate launch` that ended with `exit` was stopped by (accelerate >= 1.16 exits 128 +
    signum once it has stopped its processes), or None for any other exit; `since` says whether the installed
    accelerate handles signals itself."""
    if not since or not isinstance(exit.code, int):
        return None
    return next((number for number in STOPPING_SIGNALS if exit.code == 128 + number), None)
