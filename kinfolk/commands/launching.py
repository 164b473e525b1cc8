"""Starting a verb's own module on every process with `accelerate launch`, as `trl sft` does (`kinfolk sft`,
`kinfolk distil`): the arguments the verb's parser does not know, from the command line or its `--config` file, are
`accelerate launch`'s; the rest go to the launched module. A launched process's exit code (2 for bad input it
found) is the verb's. What neither the verb nor `accelerate launch` knows is refused first, in one line
(`check_launch_arguments`), instead of reaching accelerate, which would print its whole usage.

>>> check_launch_arguments("kinfolk sft", ["--num_processes", "2"], [], ["--num_processes", "2"])
>>> check_launch_arguments("kinfolk sft", ["--weight_colum", "w"], [], ["--weight_colum", "w"], ["--weight_column"])
Traceback (most recent call last):
...
kinfolk.errors.InputError: --weight_colum: unknown option, neither kinfolk sft's nor accelerate launch's; did you mean --weight_column? (see kinfolk sft --help)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from kinfolk import console
from kinfolk.atomic import staging_path
from kinfolk.commands.parsing import config_file, did_you_mean
from kinfolk.compat.accelerate import launcher_signal
from kinfolk.errors import CheckpointError, InputError, MissingInputError
from kinfolk.interrupt import LAUNCHED_ENV, Interrupted

# TRL's launcher option beside accelerate's own (`trl.cli.accelerate_config`): a config file or a named TRL config.
TRL_LAUNCH_OPTIONS = ("--accelerate_config",)


def _launch_options() -> set[str]:
    from accelerate.commands.launch import launch_command_parser

    return {*launch_command_parser()._option_string_actions, *TRL_LAUNCH_OPTIONS}


def check_launch_arguments(
    prog: str,
    argv: list[str],
    config_remaining: list[str],
    cli_remaining: list[str],
    verb_options: Iterable[str] = (),
) -> None:
    """Refuse the options (`cli_remaining`) and `--config` keys (`config_remaining`, as `--key value` pairs) that
    the verb's parser left to `accelerate launch` but that accelerate does not know either: a typo, named in one
    line (with the YAML file for a key), with the nearest of the verb's options (`verb_options`) and accelerate's."""
    known = _launch_options()
    candidates = [*verb_options, *known]
    for token in cli_remaining:
        name = token.split("=", 1)[0]
        if name.startswith("-") and name not in known:
            raise InputError(
                f"{name}: unknown option, neither {prog}'s nor accelerate launch's{did_you_mean(name, candidates)} "
                f"(see {prog} --help)"
            )
    for flag in config_remaining[::2]:
        if flag not in known:
            key, keys = flag.lstrip("-"), [option[2:] for option in candidates if option.startswith("--")]
            raise InputError(
                f"{config_file(argv)}: unknown key {key!r}, neither {prog}'s nor accelerate launch's"
                f"{did_you_mean(key, keys, quote=True)} (see {prog} --help)",
                path=config_file(argv),
            )


def without_config_defaults(launch_args: list[str]) -> list[str]:
    """`launch_args` plus the values `accelerate launch` would otherwise default with a warning when no accelerate
    config file is in use ("`--num_processes` was set to a value of `0`" on a CPU-only machine, where one process
    runs): the same values, stated. With a config file, or a value given, nothing is added."""
    import torch
    from accelerate.commands.config import default_config_file

    given = {token.split("=", 1)[0] for token in launch_args if token.startswith("--")}
    if "--config_file" in given or Path(default_config_file).is_file():
        return launch_args
    defaults = {"--num_machines": "1", "--mixed_precision": "no", "--dynamo_backend": "no"}
    if not torch.accelerator.is_available():
        defaults["--num_processes"] = "1"  # what the simple launcher runs without GPUs (see kinfolk.launch_check)
    return [*launch_args, *(item for flag, value in defaults.items() if flag not in given for item in (flag, value))]


def without_in_order(argv: list[str], taken: list[str]) -> list[str]:
    """`argv` less the tokens of `taken`, matched in order (how `trl sft` splits its own arguments from
    `accelerate launch`'s: the launcher's options leave, the script's stay, repeated values included).

    >>> without_in_order(["--lr", "1", "--num_processes", "1", "--seed", "1"], ["--num_processes", "1"])
    ['--lr', '1', '--seed', '1']
    """
    pending = iter(taken)
    current = next(pending, None)
    kept = []
    for token in argv:
        if current is not None and token == current:
            current = next(pending, None)
        else:
            kept.append(token)
    return kept


def launch(module: str, argv: list[str], config_remaining: list[str], cli_remaining: list[str]) -> int:
    """`accelerate launch --module MODULE` with the verb's own arguments; returns the exit code."""
    from accelerate.commands.launch import launch_command, launch_command_parser
    from trl.cli.accelerate_config import resolve_accelerate_config_argument

    launch_args = without_config_defaults(resolve_accelerate_config_argument(config_remaining + cli_remaining))
    script_args = without_in_order(argv, cli_remaining)
    os.environ[LAUNCHED_ENV] = "1"  # inherited by the launched processes: the launcher alone reports a signal
    try:
        launch_command(launch_command_parser().parse_args([*launch_args, "--module", module, *script_args]))
    except subprocess.CalledProcessError as failed:
        return failed.returncode
    except Interrupted as interrupted:  # the launched processes stop too (a checkpoint in progress stays staged)
        _stop_children(interrupted.signum)
        raise
    except SystemExit as exit:  # accelerate >= 1.16 has stopped them itself, then exits 128 + the signal
        signum = launcher_signal(exit)
        if signum is None:
            raise
        _stop_children(signum)
        raise Interrupted(signum) from None
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


def remove_tree(path: Path) -> None:
    """Remove a directory by first renaming it to a staging name: a removal cut short leaves no half-deleted tree
    where a user or a rerun would read it (the next run to that destination removes what is left)."""
    retired = staging_path(path)
    path.rename(retired)
    shutil.rmtree(retired)


def last_checkpoint(resume: str | None, output_dir: str | Path) -> str | None:
    """The checkpoint `--resume_from_checkpoint` names: a directory as given, or for "true" the last `checkpoint-N`
    under `output_dir` (as `Trainer.train(resume_from_checkpoint=True)` finds it); refuses "true" with none there."""
    from transformers.trainer_utils import get_last_checkpoint

    if resume is None or resume.lower() != "true":
        return resume
    found = get_last_checkpoint(str(output_dir)) if Path(output_dir).is_dir() else None
    if found is None:
        raise CheckpointError(
            f"--resume_from_checkpoint true: {output_dir} holds no checkpoint-N to resume from", path=output_dir
        )
    return found


def resume_from_last_checkpoint(argv: list[str]) -> list[str]:
    """The rerun of an interrupted training verb: its arguments, continuing from the last published checkpoint."""
    return argv if "--resume_from_checkpoint" in argv else [*argv, "--resume_from_checkpoint", "true"]


def say_resumed(prog: str, training_args, output_dir: str | Path) -> None:
    """ "resuming: N of M steps done, from CHECKPOINT" when the run continues from a checkpoint."""
    from transformers.trainer_utils import get_last_checkpoint

    resume = training_args.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() == "true":
        resume = get_last_checkpoint(str(output_dir)) if Path(output_dir).is_dir() else None
    if resume:
        done = json.loads((Path(resume) / "trainer_state.json").read_text()).get("global_step")
        steps = "" if done is None else f"{done:,} of {training_args.max_steps:,} steps done, "
        console.stage(f"resuming: {steps}from {resume}", prog)


def checkpoints_at_once(training_args) -> int:
    """How many Trainer checkpoints a run keeps on disk at once: `save_total_limit` of them (+1 being published),
    or one per save of `max_steps` (0 with saving off)."""
    if str(training_args.save_strategy) in ("no", "SaveStrategy.NO"):
        return 0
    every = training_args.save_steps
    saves = round(1 / every) if every < 1 else max(1, training_args.max_steps // max(1, int(every)))
    limit = training_args.save_total_limit
    return min(saves, limit + 1) if limit else saves
