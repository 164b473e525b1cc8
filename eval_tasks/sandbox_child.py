"""The process that runs one untrusted program for `kinfolk.eval_tasks.execution` (standard library only).

Run as `python -I sandbox_child.py CONFIG_JSON`. It isolates itself, layer by layer, with whatever the kernel
offers, then executes the program file with `exec`:

1. new network and PID namespaces (as root directly, otherwise inside a new user namespace): no network at
   all, and when the namespace's first process dies the kernel kills everything the program spawned;
2. a forked child (PID 1 of that namespace) that this process kills at the wall-clock deadline;
3. resource limits in the child: address space, CPU seconds, file size, open files, no core dumps, and a
   process count (as root, the real uid becomes one no other process has, `SANDBOX_UID_BASE` plus this process's
   pid, and every capability is dropped, since the kernel never applies the process limit to uid 0 or to holders
   of CAP_SYS_RESOURCE; a uid of its own makes the limit exact whatever else runs as `nobody` meanwhile);
4. Landlock: writes, removals and creations only beneath the sandbox directory, no TCP bind or connect, and
   (ABI ≥ 6) no signals or abstract sockets reaching outside.

It writes one JSON line to the descriptor `report_fd` describing the layers that took effect, then exits with the program's status
(124 when the deadline killed it).
"""

import ctypes
import json
import os
import resource
import signal
import sys
import traceback

CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
NOBODY = 65534
# Sandbox uids: above the ranges that distributions and container runtimes hand out (system and login users below
# 2**16, subordinate ids from 100000 in blocks of 65536), plus a host pid (< 2**22), so two live sandboxes never share one.
SANDBOX_UID_BASE = 0x60000000
TIMEOUT_STATUS = 124

# Landlock access rights (include/uapi/linux/landlock.h); reads and execution stay unrestricted.
FS_WRITE_FILE, FS_REMOVE_DIR, FS_REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
FS_MAKE = sum(1 << bit for bit in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

libc = ctypes.CDLL(None, use_errno=True)


def _fail(what):
    return OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def running_as_root():
    return os.geteuid() == 0 and os.getuid() == 0


def enter_namespaces():
    flags = CLONE_NEWNET | CLONE_NEWPID
    if os.geteuid() != 0:
        flags |= CLONE_NEWUSER
    return libc.unshare(flags) == 0


def drop_root(uid):
    # Only a non-zero real uid without CAP_SYS_RESOURCE is held to RLIMIT_NPROC. The effective uid stays 0 so the
    # interpreter can still read its own files; Landlock, not file ownership, is what confines writes.
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last_cap = int(handle.read())
    for cap in range(last_cap + 1):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise _fail("PR_CAPBSET_DROP")
    os.setgroups([])
    os.setresgid(NOBODY, os.getegid(), os.getegid())
    os.setresuid(uid, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    header, data = Header(0x20080522, 0), (Data * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise _fail("capset")


def user_process_count(uid):
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as status:
                    if any(line.startswith("Uid:") and line.split()[1] == str(uid) for line in status):
                        count += 1
            except OSError:
                pass
    return count


def set_limits(limits, as_root):
    def both(kind, value):
        resource.setrlimit(kind, (value, value))

    both(resource.RLIMIT_AS, limits["memory_bytes"])
    both(resource.RLIMIT_CPU, limits["cpu_seconds"])
    both(resource.RLIMIT_FSIZE, limits["file_bytes"])
    both(resource.RLIMIT_NOFILE, limits["open_files"])
    both(resource.RLIMIT_CORE, 0)
    # The kernel counts every process of the real uid. As root that uid becomes the sandbox's own, which nothing else
    # has; otherwise it stays the caller's, so leave room for the processes the caller already runs.
    baseline = 0 if as_root else user_process_count(os.getuid())
    both(resource.RLIMIT_NPROC, baseline + limits["processes"])


def landlock(directory):
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return 0
    handled_fs = FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE
    handled_fs |= (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = RulesetAttr(handled_fs, NET_BIND_TCP | NET_CONNECT_TCP, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise _fail("landlock_create_ruleset")
    file_rights = FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0)
    for path, rights in ((directory, handled_fs), ("/dev/null", file_rights)):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = PathBeneath(rights, fd)
        if libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0) != 0:  # LANDLOCK_RULE_PATH_BENEATH
            raise _fail(f"landlock_add_rule {path}")
        os.close(fd)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _fail("PR_SET_NO_NEW_PRIVS")
    if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
        raise _fail("landlock_restrict_self")
    os.close(ruleset)
    return abi


def layers(report):
    """Which protections are in force, by what they protect."""
    return {
        "filesystem": report["landlock_abi"] >= 1,
        "network": report["namespaces"] or report["landlock_abi"] >= 4,
        "processes": report["namespaces"],
    }


def run_program(config, report):
    as_root = running_as_root()
    set_limits(config["limits"], as_root)
    if as_root:
        drop_root(report["uid"])
    report["dropped_root"] = as_root
    report["landlock_abi"] = landlock(config["directory"])
    missing = [layer for layer, present in layers(report).items() if layer in config["require"] and not present]
    if missing:
        raise RuntimeError(f"refusing to run: this kernel does not provide {', '.join(missing)} isolation")
    os.write(config["report_fd"], (json.dumps(report) + "\n").encode())
    os.close(config["report_fd"])
    with open(config["program"], encoding="utf-8") as handle:
        source = handle.read()
    exec(compile(source, config["program"], "exec"), {"__name__": "__main__", "__builtins__": __builtins__})


def main():
    config = json.loads(sys.argv[1])
    # The host pid, read before the new PID namespace: the sandbox's processes run under this uid.
    report = {
        "uid": SANDBOX_UID_BASE + os.getpid() if running_as_root() else os.getuid(),
        "namespaces": enter_namespaces(),
    }
    child = os.fork()
    if child == 0:
        status = 0
        try:
            run_program(config, report)
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    os.close(config["report_fd"])

    def deadline(*_):
        os.kill(child, signal.SIGKILL)
        # Reaping the namespace's init returns only once the kernel has killed everything else inside it.
        os.waitpid(child, 0)
        os._exit(TIMEOUT_STATUS)

    signal.signal(signal.SIGALRM, deadline)
    signal.signal(signal.SIGTERM, deadline)
    signal.setitimer(signal.ITIMER_REAL, config["limits"]["timeout_seconds"])
    _, status = os.waitpid(child, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    os._exit(os.waitstatus_to_exitcode(status) % 256 if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main()
