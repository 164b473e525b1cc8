"""The pass@1 sandbox against hostile programs: each must fail (or time out) without touching the machine."""

import concurrent.futures
import os
import socket
import subprocess
import time

import pytest

from kinfolk.eval_tasks.execution import (
    ALLOW_ENV,
    CodeExecutionNotAllowed,
    SandboxLimits,
    pass_at_1,
    run_untrusted,
    test_program,
)
from kinfolk.eval_tasks.sandbox_child import SANDBOX_UID_BASE

QUICK = SandboxLimits(timeout_seconds=2.0)


def process_uids() -> dict[int, int]:
    """Every live process's real uid, by pid."""
    uids = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/status") as status:
                uids[int(entry)] = next(int(line.split()[1]) for line in status if line.startswith("Uid:"))
        except (OSError, StopIteration):
            pass
    return uids


def processes_of(uid: int) -> int:
    return sum(owner == uid for owner in process_uids().values())


def no_survivors(uid: int, baseline: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if processes_of(uid) <= baseline:
            return True
        time.sleep(0.1)
    return False


def test_refuses_without_opt_in(monkeypatch, tmp_path):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    marker = tmp_path / "ran"
    with pytest.raises(CodeExecutionNotAllowed, match=ALLOW_ENV):
        run_untrusted(f"open({str(marker)!r}, 'w')")
    assert not marker.exists()
    monkeypatch.setenv(ALLOW_ENV, "1")
    assert run_untrusted("assert True").passed


def test_pass_and_fail_are_told_apart():
    completion = "def add(a, b):\n    return a + b\n"
    assert pass_at_1(completion, ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"], allow=True) == 1.0
    assert pass_at_1(completion, ["assert add(2, 3) == 6"], allow=True) == 0.0
    assert pass_at_1("def add(a, b) return", ["assert add(1, 1) == 2"], allow=True) == 0.0  # syntax error
    result = run_untrusted("print('hello')\nraise SystemExit(3)", allow=True)
    assert (result.status, result.returncode, result.stdout) == ("failed", 3, "hello\n")
    assert result.layers == {
        "uid": result.layers["uid"] if os.geteuid() == 0 else os.getuid(),
        "namespaces": True,
        "dropped_root": os.geteuid() == 0,
        "landlock_abi": result.layers["landlock_abi"],
    }


def test_program_concatenates_in_order():
    assert test_program("def f(): pass", ["assert f() is None"], "import math") == (
        "def f(): pass\n\nimport math\n\nassert f() is None"
    )


def test_infinite_loop_times_out():
    start = time.monotonic()
    result = run_untrusted("while True:\n    pass", QUICK, allow=True)
    assert result.status == "timeout"
    assert time.monotonic() - start < QUICK.timeout_seconds + 3


FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"


def test_fork_bomb_is_contained():
    result = run_untrusted(FORK_BOMB, QUICK, allow=True)
    assert result.status == "timeout"
    counted = run_untrusted(
        "import os, time\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    n += 1\nprint(n)",
        QUICK,
        allow=True,
    )
    assert counted.passed and int(counted.stdout) < QUICK.processes  # the process limit, not the loop, stopped it


def test_nothing_a_fork_bomb_forked_outlives_the_sandbox():
    if os.geteuid() != 0:
        pytest.skip("the sandbox gets a uid of its own, whose processes can be counted, only when started as root")
    result = run_untrusted(FORK_BOMB, QUICK, allow=True)
    assert result.status == "timeout"
    assert result.layers["uid"] not in (0, 65534)
    assert no_survivors(result.layers["uid"], 0)


def test_detached_grandchild_dies_with_the_sandbox(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("counting the sandbox's processes needs the dedicated uid it gets when started as root")
    # Other processes of nobody's uid (system services, sandboxes still being reaped) must not use up the
    # sandbox's own process allowance: more of them than the allowance are running while it forks.
    others = [subprocess.Popen(["sleep", "30"], user=65534) for _ in range(SandboxLimits().processes + 4)]
    try:
        program = (
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\nprint('left')"
        )
        result = run_untrusted(program, QUICK, allow=True)
        assert result.passed, result.stderr
        assert no_survivors(result.layers["uid"], 0)
    finally:
        for other in others:
            other.kill()
            other.wait()


def sandbox_waiting_for(marker: str) -> bool:
    """Whether a sandboxed program that mentions `marker` runs under a sandbox uid (so its limits are set)."""
    for pid, uid in process_uids().items():
        if uid < SANDBOX_UID_BASE:
            continue
        try:
            with open(os.path.join(os.readlink(f"/proc/{pid}/cwd"), "program.py")) as handle:
                if marker in handle.read():
                    return True
        except OSError:
            pass
    return False


def test_process_allowance_holds_when_nobodys_processes_end_meanwhile(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the sandbox gets a uid of its own only when started as root")
    # Processes of another uid that end after the sandbox set its limits must not widen its allowance.
    others = [subprocess.Popen(["sleep", "30"], user=65534) for _ in range(SandboxLimits().processes + 4)]
    marker = tmp_path / "go"
    program = (
        f"import os, time\nwhile not os.path.exists({str(marker)!r}):\n    time.sleep(0.01)\nn = 0\n"
        "for _ in range(200):\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    n += 1\nprint(n)"
    )
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        counted = pool.submit(run_untrusted, program, SandboxLimits(timeout_seconds=20), True)
        deadline = time.monotonic() + 15
        while not sandbox_waiting_for(str(marker)) and time.monotonic() < deadline:
            time.sleep(0.01)
        for other in others:
            other.kill()
            other.wait()
        marker.write_text("")
        result = counted.result()
    assert result.passed, result.stderr
    assert int(result.stdout) == SandboxLimits().processes - 1  # the program itself is one of its processes


def test_huge_allocation_fails():
    result = run_untrusted("block = bytearray(64 * 2**30)\nprint(len(block))", QUICK, allow=True)
    assert result.status == "failed" and "MemoryError" in result.stderr


def test_cannot_write_outside_its_directory(tmp_path):
    target = tmp_path / "escaped.txt"
    shared_tmp = f"/tmp/kinfolk-escape-{os.getpid()}.txt"
    for path in (target, shared_tmp):
        result = run_untrusted(f"open({str(path)!r}, 'w').write('x')", QUICK, allow=True)
        assert result.status == "failed" and "PermissionError" in result.stderr
        assert not os.path.exists(path)
    inside = run_untrusted("open('scratch.txt', 'w').write('fine')\nprint(open('scratch.txt').read())", allow=True)
    assert inside.passed and inside.stdout == "fine\n"


def test_cannot_open_a_socket():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        tcp = run_untrusted(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", QUICK, allow=True
        )
        udp = run_untrusted(
            "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('10.0.0.1', 53))",
            QUICK,
            allow=True,
        )
        assert tcp.status == "failed" and udp.status == "failed"
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


def test_cannot_signal_the_caller():
    result = run_untrusted(f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)", QUICK, allow=True)
    assert result.status == "failed"  # and this test process is still alive to check it


def test_output_is_capped():
    result = run_untrusted(
        "while True:\n    print('x' * 1000)", SandboxLimits(timeout_seconds=5, file_bytes=1 << 20), allow=True
    )
    assert result.status == "failed"  # the file-size limit stops it (SIGXFSZ) long before the deadline
    assert len(result.stdout) <= SandboxLimits().output_chars
