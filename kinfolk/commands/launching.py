"""Starting a verb's own module on every process with `accelerate launch`, as `trl sft` does (`kinfolk sft`,
`kinfolk distil`): the arguments the verb's parser does not know, from the command line or its `--config` file, are
`accelerate launch`'s; the rest go to the launched module. A launched process's exit code (2 for bad input it
found) is the verb's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kinfolk.errors import CheckpointError, MissingInputError


def launch(module: str, argv: list[str], config_remaining: list[str], cli_remaining: list[str]) -> int:
    """`accelerate launch --module MODULE` with the verb's own arguments; returns the exit code."""
    from accelerate.commands.launch import launch_command, launch_command_parser
    from trl.cli.accelerate_config import resolve_accelerate_config_argument
    from trl.cli.commands.training import _subtract_subsequence  # how `trl sft` splits its own arguments

    launch_args = resolve_accelerate_config_argument(config_remaining + cli_remaining)
    script_args = _subtract_subsequence(argv, cli_remaining)
    try:
        launch_command(launch_command_parser().parse_args([*launch_args, "--module", module, *script_args]))
    except subprocess.CalledProcessError as failed:
        return failed.returncode
    return 0


def check_resume_checkpoint(resume: str) -> None:
    """Refuse a `--resume_from_checkpoint` directory that is not there or is not a Trainer checkpoint (no
    `trainer_state.json`), before anything is launched."""
    from transformers.trainer import TRAINER_STATE_NAME

    if (Path(resume) / TRAINER_STATE_NAME).is_file():
        return
    if Path(resume).is_dir():
        raise CheckpointError(f"--resume_from_checkpoint {resume} has no {TRAINER_STATE_NAME}: not a checkpoint")
    raise MissingInputError(f"--resume_from_checkpoint {resume}: no such checkpoint directory", path=resume)
