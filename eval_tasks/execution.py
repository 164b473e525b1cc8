"""kinfolk's executor for model-written code: one sandboxed subprocess per sample, for pass@1 metrics.

Model output is untrusted. Each program runs in a fresh Python process (`python -I`) in a throw-away directory
with a wall-clock timeout, memory / CPU / file-size / open-file / process limits, no network, writes confined to
that directory and, where the kernel allows, its own PID namespace so nothing it spawns outlives it (see
`sandbox_child.py` for the layers). By default it refuses to run where the kernel cannot provide filesystem,
network and process isolation, and it refuses to run at all unless code execution was switched on explicitly:
`allow=True`, or `KINFOLK_ALLOW_CODE_EXECUTION=1` in the environment (what `kinfolk eval
--confirm_run_unsafe_code` and `LmEvalCallback(confirm_run_unsafe_code=True)` set).

>>> result = run_untrusted("assert sum([1, 2]) == 3", allow=True)  # doctest: +SKIP
>>> result.status  # doctest: +SKIP
'passed'
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ALLOW_ENV = "KINFOLK_ALLOW_CODE_EXECUTION"
CHILD = Path(__file__).with_name("sandbox_child.py")
LAYERS = ("filesystem", "network", "processes")
TIMEOUT_STATUS = 124  # what sandbox_child exits with when its deadline fires


class CodeExecutionNotAllowed(PermissionError):
    """Running model-written code was not switched on."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-sample limits; the defaults suit MBPP/HumanEval-style unit tests."""

    timeout_seconds: float = 10.0
    memory_bytes: int = 2 << 30
    cpu_seconds: int = 20
    file_bytes: int = 16 << 20
    open_files: int = 64
    processes: int = 16
    output_chars: int = 4000  # tail of stdout / stderr kept in the result


@dataclass
class ExecutionResult:
    status: str  # "passed", "failed", "timeout" or "sandbox_error"
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    layers: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def as_dict(self) -> dict:
        return asdict(self)


def execution_allowed(allow: bool | None = None) -> bool:
    return bool(allow) or os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def check_allowed(allow: bool | None = None) -> None:
    if not execution_allowed(allow):
        raise CodeExecutionNotAllowed(
            "running model-generated code is switched off: pass allow=True, set "
            f"{ALLOW_ENV}=1, or run `kinfolk eval ... --confirm_run_unsafe_code`"
        )


def _child_env(directory: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": directory,
        "TMPDIR": directory,
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _wait_unreaped(process: subprocess.Popen, deadline: float) -> bool:
    """Wait for exit without reaping, so the process group id cannot be reused before we kill the group."""
    pause = 0.001
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
    return False


def _tail(path: Path, chars: int) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - 4 * chars))
        return handle.read().decode("utf-8", errors="replace")[-chars:]


def run_untrusted(
    program: str,
    limits: SandboxLimits = SandboxLimits(),
    allow: bool | None = None,
    require: Sequence[str] = LAYERS,
) -> ExecutionResult:
    """Run `program` (Python source) in the sandbox; `status` is "passed" when it exits with status 0."""
    check_allowed(allow)
    unknown = set(require) - set(LAYERS)
    if unknown:
        raise ValueError(f"unknown isolation layers {sorted(unknown)}; choose from {', '.join(LAYERS)}")
    sandbox = tempfile.mkdtemp(prefix="kinfolk-sandbox-")
    outputs = tempfile.mkdtemp(prefix="kinfolk-sandbox-out-")
    report_read, report_write = os.pipe()
    try:
        program_path = Path(sandbox) / "program.py"
        program_path.write_text(program, encoding="utf-8")
        config = {
            "program": str(program_path),
            "directory": sandbox,
            "report_fd": report_write,
            "require": list(require),
            "limits": {
                name: getattr(limits, name)
                for name in ("timeout_seconds", "memory_bytes", "cpu_seconds", "file_bytes", "open_files", "processes")
            },
        }
        stdout_path, stderr_path = Path(outputs) / "stdout", Path(outputs) / "stderr"
        start = time.monotonic()
        with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-I", str(CHILD), json.dumps(config)],
                cwd=sandbox,
                env=_child_env(sandbox),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                pass_fds=(report_write,),
                start_new_session=True,
            )
        os.close(report_write)
        report_write = -1
        # The child enforces the deadline itself; this backstop covers a child that cannot.
        exited = _wait_unreaped(process, start + limits.timeout_seconds + 5.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # whatever it left in its group goes too
            os.killpg(process.pid, signal.SIGKILL)
        returncode = process.wait()
        seconds = time.monotonic() - start
        with os.fdopen(report_read, "rb") as handle:
            report_read = -1
            report_line = handle.read().decode().strip()
        layers = json.loads(report_line) if report_line else {}
        if not layers:
            status = "timeout" if not exited else "sandbox_error"
        elif not exited or returncode == TIMEOUT_STATUS:
            status = "timeout"
        else:
            status = "passed" if returncode == 0 else "failed"
        return ExecutionResult(
            status,
            returncode,
            _tail(stdout_path, limits.output_chars),
            _tail(stderr_path, limits.output_chars),
            seconds,
            layers,
        )
    finally:
        for descriptor in (report_read, report_write):
            if descriptor >= 0:
                os.close(descriptor)
        shutil.rmtree(sandbox, ignore_errors=True)
        shutil.rmtree(outputs, ignore_errors=True)


def test_program(completion: str, tests: str | Sequence[str], setup: str = "") -> str:
    """The program a pass@1 check runs: the model's code, then the task's setup code, then its tests."""
    test_code = tests if isinstance(tests, str) else "\n".join(tests)
    return "\n\n".join(part for part in (completion, setup, test_code) if part)


test_program.__test__ = False  # a helper named test_*, not a pytest test


def pass_at_1(
    completion: str,
    tests: str | Sequence[str],
    setup: str = "",
    limits: SandboxLimits = SandboxLimits(),
    allow: bool | None = None,
) -> float:
    """1.0 when `completion` passes every test in the sandbox, else 0.0 (one greedy sample: pass@1)."""
    return float(run_untrusted(test_program(completion, tests, setup), limits, allow).passed)
