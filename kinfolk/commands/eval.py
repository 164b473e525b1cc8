"""`kinfolk eval`: lm-eval's own command line, with kinfolk imported first and kinfolk's tasks on the path.

    kinfolk eval --model hf --model_args pretrained=Qwen/Qwen3-8B,peft=runs/atlas \\
        --tasks kinfolk_mbpp_plus --confirm_run_unsafe_code --log_samples --output_path results/

What kinfolk adds to lm-eval's CLI:

- `import kinfolk` runs before lm-eval builds the model, so `--model_args pretrained=DIR,peft=ADAPTER_DIR` loads
  kinfolk's adapter types (ATLAS) as well as PEFT's own;
- kinfolk's `eval_tasks/` are always indexed; lm-eval's `--include_path` adds more folders (several, separated by
  `os.pathsep`);
- lm-eval's `--confirm_run_unsafe_code` also switches on kinfolk's sandboxed code execution (the MBPP tasks);
- kinfolk's own options, listed by `kinfolk eval --help`;
- bad input is refused before any model loads, as one line with exit 2: lm-eval's own argument checks (no
  `--tasks`, a task not found, `--log_samples` without `--output_path`, ...) and kinfolk's of the paths (a local
  `pretrained=` model and `peft=` adapter that cannot load, an `--output_path` that cannot be written, found by
  lm-eval only after the evaluation).

Every other option is lm-eval's and passes through unchanged: `lm-eval run --help` lists them.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import kinfolk  # noqa: F401  (registers kinfolk's PEFT types before lm-eval loads any adapter)
from kinfolk.adapter_checks import check_adapter_fits_base
from kinfolk.atomic import check_writable
from kinfolk.commands.parsing import VerbParser, reworded
from kinfolk.errors import AdapterConfigError, CheckpointError, InputError, MissingInputError
from kinfolk.eval_tasks import task_dir
from kinfolk.eval_tasks.execution import ALLOW_ENV
from kinfolk.inputs import check_model, is_local_path, read_json

# lm-eval model types that load `pretrained=` (and `peft=`) with transformers.
HF_MODELS = ("hf", "hf-auto", "huggingface")


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


def check_paths(config) -> None:
    """Refuse, before lm-eval loads anything, local model and adapter paths that cannot load (or an adapter made
    for another model: `kinfolk.adapter_checks`) and an output path that cannot be written. Hub ids are checked as far as the local cache allows (`kinfolk.inputs.check_model`)."""
    model_args = config.model_args or {}
    if config.model in HF_MODELS and isinstance(model_args.get("pretrained"), str):
        check_model(model_args["pretrained"], "pretrained=", tokenizer="tokenizer" not in model_args)
    adapter = model_args.get("peft")
    if config.model in HF_MODELS and isinstance(adapter, str) and is_local_path(adapter):
        check_adapter(adapter)
        if isinstance(model_args.get("pretrained"), str):  # an adapter made on another model: refused unloaded
            check_adapter_fits_base(adapter, model_args["pretrained"], "the peft= adapter")
    if config.output_path:
        path = Path(config.output_path)
        check_writable(path if path.suffix == ".json" else path / "results")
    include = config.include_path or []
    for folder in include.split(os.pathsep) if isinstance(include, str) else include:
        if folder and not Path(folder).exists():  # lm-eval would skip it, and a task in it would be "not found"
            raise MissingInputError(f"--include_path {folder}: no such folder", path=folder)


def check_adapter(path: str) -> None:
    """A saved PEFT adapter directory whose config loads with its type's own checks (ATLAS names edited fields)."""
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

    if not Path(path).is_dir():
        if Path(path).exists():
            raise CheckpointError(f"peft={path} is a file; give the adapter's directory", path=path)
        raise MissingInputError(f"peft={path}: no such adapter directory", path=path)
    peft_type = read_json(Path(path) / "adapter_config.json", "adapter config").get("peft_type")
    if peft_type not in PEFT_TYPE_TO_CONFIG_MAPPING:
        raise AdapterConfigError(f"peft={path}: unknown peft_type {peft_type!r} in adapter_config.json", path=path)
    PEFT_TYPE_TO_CONFIG_MAPPING[peft_type].from_pretrained(path)


def _checked(config_class):
    """lm-eval's run config, its argument errors reported as bad input and the paths checked (`check_paths`).

    lm-eval raises `ValueError` from its argument checks (`from_cli`) and task lookup (`process_tasks`), both
    before any model loads; everything it raises there is about the command line it was given."""

    class CheckedConfig(config_class):
        @classmethod
        def from_cli(cls, namespace):
            try:
                config = super().from_cli(namespace)
            except (ValueError, TypeError, FileNotFoundError) as error:
                raise InputError(str(error)) from error
            check_paths(config)
            return config

        def process_tasks(self, metadata=None):
            try:
                manager = super().process_tasks(metadata)
            except ValueError as error:
                raise InputError(str(error)) from error
            if not self.tasks:  # lm-eval finds out only after loading the model
                raise InputError("no --tasks given; name the tasks to run (`lm-eval list tasks` lists them)")
            return manager

    return CheckedConfig


def _usage_errors_as_kinfolk_eval(parser) -> None:
    """lm-eval's parser (and each sub-command's) reports a usage error as kinfolk eval's one line: the user typed
    `kinfolk eval`, whose own options and lm-eval's are both accepted (an unknown one with the nearest of them)."""
    subparsers = {
        name: subparser
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, subparser in action.choices.items()
    }
    known = [*make_parser().option_names(), *parser._option_string_actions]
    known += [option for subparser in subparsers.values() for option in subparser._option_string_actions]

    def refuse(message: str):
        raise InputError(f"{reworded(message, known)} (see kinfolk eval --help and lm-eval run --help)")

    parser.prog = "kinfolk eval"
    parser.error = refuse
    for name, subparser in subparsers.items():
        subparser.prog = f"kinfolk eval {name}"
        subparser.error = refuse


def cli_evaluate() -> None:
    """`lm_eval.__main__.cli_evaluate`, its usage errors spoken as kinfolk eval's."""
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    setup_logging()
    harness = HarnessCLI()
    _usage_errors_as_kinfolk_eval(harness._parser)
    harness.execute(harness.parse_args())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    (options,), lm_eval_argv = make_parser().parse_known(argv)
    import lm_eval.config.evaluate_config as evaluate_config
    import lm_eval.tasks

    saved = sys.argv, lm_eval.tasks.TaskManager, os.environ.get(ALLOW_ENV), evaluate_config.EvaluatorConfig
    lm_eval.tasks.TaskManager = _with_kinfolk_tasks(lm_eval.tasks.TaskManager, not options.skip_default_tasks)
    evaluate_config.EvaluatorConfig = _checked(evaluate_config.EvaluatorConfig)
    if "--confirm_run_unsafe_code" in lm_eval_argv:
        os.environ[ALLOW_ENV] = "1"
    sys.argv = ["kinfolk eval", *lm_eval_argv]  # lm-eval's CLI reads sys.argv itself
    try:
        cli_evaluate()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:  # leave the process as it was, for callers that run this in-process
        sys.argv, lm_eval.tasks.TaskManager, evaluate_config.EvaluatorConfig = saved[0], saved[1], saved[3]
        if saved[2] is None:
            os.environ.pop(ALLOW_ENV, None)
        else:
            os.environ[ALLOW_ENV] = saved[2]
    return 0
