"""Did the launcher start the processes the run asked for? A warning when it started fewer.

On a machine without GPUs `accelerate launch --num_processes 2 train.py` (and `--cpu --num_processes 2`) starts ONE
process and says nothing: accelerate's simple launcher runs the script once unless an MPI hostfile is given. Only
`--multi_gpu` goes through torchrun, whose workers then train with DDP over gloo on the CPU:

    accelerate launch --multi_gpu --num_processes 4 train.py     # 4 CPU processes when no GPU is visible

A run that asked for N processes and got one sees the same data N times slower (per-device batch sizes unchanged,
so a different global batch too). kinfolk's trainers call `warn_if_fewer_processes` once the distributed state
exists. What was asked is read, in order, from torchrun's `WORLD_SIZE`, the `--num_processes` of the parent
`accelerate launch` command, or the accelerate config file that command uses.

>>> requested_processes({"WORLD_SIZE": "4"}, launch_args=None)
(4, 'WORLD_SIZE')
>>> requested_processes({}, launch_args=["--cpu", "--num_processes", "2", "train.py"])
(2, 'accelerate launch --num_processes')
>>> requested_processes({}, launch_args=None) is None
True
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

logger = logging.getLogger(__name__)

_LAUNCH_COMMANDS = ("launch", "accelerate.commands.launch")
_warned = False


def launch_arguments() -> list[str] | None:
    """The arguments after `launch` of the parent process when it is `accelerate launch`, else None."""
    try:
        import psutil  # an accelerate dependency

        argv = psutil.Process().parent().cmdline()
    except Exception:  # no parent, no permission, no psutil: nothing to read
        return None
    for index, token in enumerate(argv[:-1]):
        if token in _LAUNCH_COMMANDS and any("accelerate" in part for part in argv[: index + 1]):
            return argv[index + 1 :]
    return None


def requested_processes(environ: Mapping[str, str], launch_args: Sequence[str] | None) -> tuple[int, str] | None:
    """(process count the run asked for, where that was read), or None when nothing says."""
    if environ.get("WORLD_SIZE", "").isdigit():
        return int(environ["WORLD_SIZE"]), "WORLD_SIZE"
    if launch_args is None:
        return None
    from accelerate.commands.config import default_config_file, load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    try:
        args, _ = launch_command_parser().parse_known_args(list(launch_args))
    except SystemExit:  # a command line accelerate itself would refuse
        return None
    if args.num_processes is not None:
        return args.num_processes, "accelerate launch --num_processes"
    # accelerate reads a config file when one is passed, or its default one unless --cpu is given
    config_file = args.config_file or (
        default_config_file if os.path.isfile(default_config_file) and not args.cpu else None
    )
    if config_file is None:
        return None
    try:
        num_processes = load_config_from_file(config_file).num_processes
    except Exception:
        return None
    return (num_processes, f"accelerate config {config_file}") if isinstance(num_processes, int) else None


def warn_if_fewer_processes(actual_processes: int) -> None:
    """Log a warning (once per process, from rank 0) when the launch asked for more processes than run."""
    global _warned
    if _warned or os.environ.get("RANK", "0") != "0":
        return
    requested = requested_processes(os.environ, launch_arguments())
    if requested is None or requested[0] <= actual_processes:
        return
    _warned = True
    count, source = requested
    logger.warning(
        f"this run asked for {count} processes ({source}) but runs as {actual_processes}. Without GPUs, "
        "`accelerate launch --num_processes N` starts a single process; start N CPU processes with "
        "`accelerate launch --multi_gpu --num_processes N` (DDP over gloo). See docs/distributed.md."
    )
