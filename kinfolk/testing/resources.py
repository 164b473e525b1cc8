"""Wall time and peak resident memory of a block of code, for the real-checkpoint tests and their README figures.

`measure()` resets the kernel's per-process high-water mark of resident memory (`/proc/self/clear_refs`,
Linux ≥ 4.0), so a block's peak is its own even after earlier, larger work in the same process; elsewhere it
falls back to the process-lifetime peak (`ru_maxrss`) and says so in `Usage.resettable`. `extra_bytes` is the
peak above the resident memory at the start: what the block itself needed at its worst moment.

With `KINFOLK_RESOURCES_LOG=path.jsonl`, every named measurement is appended there as one JSON line, which is
how the README's table of times and memory per component and model was collected from `make test-real`.

>>> with measure("sum") as usage:
...     total = sum(range(1000))
>>> usage.seconds >= 0 and usage.peak_bytes >= usage.start_bytes > 0
True
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

LOG_ENV = "KINFOLK_RESOURCES_LOG"
GIB = 1 << 30


def _status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS (VmHWM) to the current RSS
    except OSError:
        return False
    return True


def _peak_bytes() -> int:
    peak = _status_bytes("VmHWM")
    if peak is not None:
        return peak
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, kB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def current_bytes() -> int:
    """Resident memory of this process now (0 where /proc is missing)."""
    return _status_bytes("VmRSS") or 0


@dataclass
class Usage:
    """What `measure` saw; filled in when the block ends."""

    name: str
    seconds: float = 0.0
    start_bytes: int = 0
    peak_bytes: int = 0
    resettable: bool = True

    @property
    def extra_bytes(self) -> int:
        return max(self.peak_bytes - self.start_bytes, 0)

    def summary(self) -> str:
        return (
            f"{self.name}: {self.seconds:.1f} s, peak RSS {self.peak_bytes / GIB:.2f} GiB "
            f"(+{self.extra_bytes / GIB:.2f} GiB)"
        )


@contextlib.contextmanager
def measure(name: str = "", log: str | Path | None = None, **labels) -> Iterator[Usage]:
    """Time the block and record its peak RSS; `labels` (e.g. model=...) go into the JSON log line."""
    usage = Usage(name, resettable=_reset_peak())
    usage.start_bytes = current_bytes()
    start = time.perf_counter()
    try:
        yield usage
    finally:
        usage.seconds = time.perf_counter() - start
        usage.peak_bytes = _peak_bytes()
        log = log or os.environ.get(LOG_ENV)
        if log and name:
            row = {**asdict(usage), "extra_bytes": usage.extra_bytes, **labels}
            with open(log, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
