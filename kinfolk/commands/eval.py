"""`kinfolk eval`: lm-eval's own command line, with kinfolk imported first and kinfolk's tasks on the path.

    kinfolk eval --model hf --model_args pretrained=Qwen/Qwen3-8B,peft=runs/atlas \\
        --tasks kinfolk_mbpp_plus --confirm_run_unsafe_code --log_samples --output_path results/

What kinfolk adds to lm-eval's CLI:

- `import kinfolk` runs before lm-eval builds the model, so `--model_args pretrained=DIR,peft=ADAPTER_DIR` loads
  kinfolk's adapter types (ATLAS) as well as PEFT's own;
- kinfolk's `eval_tasks/` are always indexed; lm-eval's `--include_path` adds more folders (several, separated by
  `os.pathsep`);
- lm-eval's `--confirm_run_unsafe_code` also switches on kinfolk's sandboxed code execution (the MBPP tasks);
- kinfolk's own options, listed by `kinfolk eval --help`.

Every other option is lm-eval's and passes through unchanged: `lm-eval run --help` lists them.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import kinfolk  # noqa: F401  (registers kinfolk's PEFT types before lm-eval loads any adapter)
from kinfolk.commands.parsing import VerbParser
from kinfolk.eval_tasks import task_dir
from kinfolk.eval_tasks.execution import ALLOW_ENV


@dataclass
class EvalArguments:
    skip_default_tasks: bool = field(
        default=False,
        metadata={
            "help": "leave lm-eval's thousands of built-in task YAMLs unindexed (saves seconds to a minute per run "
            "when only kinfolk's and --include_path tasks are wanted)"
        },
    )


def make_parser() -> VerbParser:
    return VerbParser(
        EvalArguments,
        prog="kinfolk eval",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,  # a prefix of one of lm-eval's options must reach lm-eval
        epilog="Every other option goes to lm-eval unchanged (`lm-eval run --help` lists them), e.g. --model hf "
        "--model_args pretrained=DIR,peft=ADAPTER --tasks kinfolk_gsm8k --log_samples --output_path results/.",
    )


def _with_kinfolk_tasks(task_manager_class, include_defaults: bool = True):
    """A TaskManager that always indexes kinfolk's tasks ahead of the user's `--include_path` folders."""

    class KinfolkTaskManager(task_manager_class):
        def __init__(self, include_path=None, *args, **kwargs):
            if not include_defaults:
                kwargs["include_defaults"] = False
            if include_path is None:
                paths = []
            elif isinstance(include_path, (list, tuple)):
                paths = list(include_path)
            else:
                paths = [part for part in str(include_path).split(os.pathsep) if part]
            super().__init__(*args, include_path=[str(task_dir()), *paths], **kwargs)

    return KinfolkTaskManager


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    (options,), lm_eval_argv = make_parser().parse_known(argv)
    import lm_eval.tasks
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv, lm_eval.tasks.TaskManager, os.environ.get(ALLOW_ENV)
    lm_eval.tasks.TaskManager = _with_kinfolk_tasks(lm_eval.tasks.TaskManager, not options.skip_default_tasks)
    if "--confirm_run_unsafe_code" in lm_eval_argv:
        os.environ[ALLOW_ENV] = "1"
    sys.argv = ["kinfolk eval", *lm_eval_argv]  # lm-eval's CLI reads sys.argv itself
    try:
        cli_evaluate()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:  # leave the process as it was, for callers that run this in-process
        sys.argv, lm_eval.tasks.TaskManager = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop(ALLOW_ENV, None)
        else:
            os.environ[ALLOW_ENV] = saved[2]
    return 0
