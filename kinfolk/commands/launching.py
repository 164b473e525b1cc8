"""Starting a verb's own module on every process with `accelerate launch`, as `trl sft` does (`kinfolk sft`,
`kinfolk distil`): the arguments the verb's parser does not know, from the command line or its `--config` file, are
`accelerate launch`'s; the rest go to the launched module. A launched process's exit code (2 for bad input it
found) is the verb's."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from kinfolk.errors import CheckpointError, MissingInputError
from kinfolk.interrupt import LAUNCHED_ENV, Interrupted


def launch(module: str, argv: list[str], config_remaining: list[str], cli_remaining: list[str]) -> int:
    """`accelerate launch --module MODULE` with the verb's own arguments; returns the exit code."""
    from accelerate.commands.launch import launch_command, launch_command_parser
    from trl.cli.accelerate_config import resolve_accelerate_config_argument
    from trl.cli.commands.training import _subtract_subsequence  # how `trl sft` splits its own arguments

    launch_args = resolve_accelerate_config_argument(config_remaining + cli_remaining)
    script_args = _subtract_subsequence(argv, cli_remaining)
    os.environ[LAUNCHED_ENV] = "1"  # inherited by the launched processes: the launcher alone reports a signal
    try:
        launch_command(launch_command_parser().parse_args([*launch_args, "--module", module, *script_args]))
    except subprocess.CalledProcessError as failed:
        return failed.returncode
    except Interrupted as interrupted:  # the launched processes stop too (a checkpoint in progress stays staged)
        _stop_children(interrupted.signum)
        raise
    finally:
        os.environ.pop(LAUNCHED_ENV, None)
    return 0


def _stop_children(signum: int, grace_seconds: float = 60.0) -> None:
    """Pass the signal on to the launched processes and wait for them (SIGKILL after `grace_seconds`): none keeps
    training, or writing, after the verb has said it stopped."""
    import psutil

    children = psutil.Process().children(recursive=False)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(signum)
    _, alive = psutil.wait_procs(children, timeout=grace_seconds)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def check_resume_checkpoint(resume: str) -> None:
    """Refuse a `--resume_from_checkpoint` directory that is not there or is not a Trainer checkpoint (no
    `trainer_state.json`), before anything is launched."""
    from transformers.trainer import TRAINER_STATE_NAME

    if (Path(resume) / TRAINER_STATE_NAME).is_file():
        return
    if Path(resume).is_dir():
        raise CheckpointError(f"--resume_from_checkpoint {resume} has no {TRAINER_STATE_NAME}: not a checkpoint")
    raise MissingInputError(f"--resume_from_checkpoint {resume}: no such checkpoint directory", path=resume)
