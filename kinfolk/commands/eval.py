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

Over a family of sizes (`--family DIR`: a `kinfolk merge patch --all` output, or any folder of model folders) it
writes the outcomes file `kinfolk route` reads (`--outcomes FILE`): one row per (split, example, size), from the
lm-eval task run on every size (`pretrained=` is each size's folder; the task's metric per example, e.g. `acc`) or,
with `--heldout FILE`, from held-out perplexity on a local file (each example's NLL; `correct` = its per-token
probability, exp(−NLL / tokens)). The examples are split into calibration and test at random, level by level
(`kinfolk.plugins.adapt.family_eval`):

    kinfolk eval --family family/ --outcomes outcomes.jsonl --tasks kinfolk_lab_reverse --skip_default_tasks
    kinfolk eval --family family/ --outcomes outcomes.jsonl --heldout heldout.jsonl --device cuda
    kinfolk route --outcomes outcomes.jsonl --models_dir family/ --out routing/
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import kinfolk  # noqa: F401  (registers kinfolk's PEFT types before lm-eval loads any adapter)
from kinfolk.adapter_checks import check_adapter_fits_base
from kinfolk.atomic import check_destination, check_writable, staging_path
from kinfolk.commands.parsing import VerbParser, reworded
from kinfolk.digits import distinct_format, shown
from kinfolk.errors import AdapterConfigError, CheckpointError, InputError, MissingInputError
from kinfolk.eval_tasks import task_dir
from kinfolk.eval_tasks.execution import ALLOW_ENV
from kinfolk.hints import suggest
from kinfolk.inputs import check_model, is_local_path, read_json

LOSS_HINT = suggest("--score loss", "route")

if TYPE_CHECKING:  # the library is imported where --family runs: it loads transformers
    from kinfolk.plugins.adapt.family_eval import OutcomesWritten

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
    family: str | None = field(
        default=None,
        metadata={
            "help": "a folder of sizes (`kinfolk merge patch --all` output): run the task (or --heldout) on every "
            "size and write --outcomes for `kinfolk route`"
        },
    )
    outcomes: str | None = field(default=None, metadata={"help": "with --family: the outcomes .jsonl to write"})
    overwrite: bool = field(default=False, metadata={"help": "with --family: replace an existing --outcomes"})
    heldout: str | None = field(
        default=None,
        metadata={
            "help": "with --family: held-out perplexity on this local file instead of an lm-eval task (`text`, or "
            "`prompt` and `completion` rows; lm-eval's --device and --batch_size apply)"
        },
    )
    level_field: str | None = field(
        default=None,
        metadata={"help": "with --family: the data's difficulty column; unset, `level` where every row has one"},
    )
    calibration_share: float = field(
        default=0.5, metadata={"help": "with --family: share of each level's examples in the calibration split"}
    )
    split_seed: int = field(default=0, metadata={"help": "with --family: seed of the calibration / test split"})
    outcome_metric: str | None = field(
        default=None, metadata={"help": "with --family: the task metric that is `correct`; unset, the task's first"}
    )
    outcome_filter: str | None = field(
        default=None, metadata={"help": "with --family: the task filter whose answers count (needed if several)"}
    )

    def __post_init__(self) -> None:
        if not 0 < self.calibration_share < 1:
            raise InputError(f"--calibration_share must lie strictly between 0 and 1, got {self.calibration_share}")


@dataclass(frozen=True)
class SizeRun:
    """One size's lm-eval run under --family: the model folder it loads and the folder its sample log goes to."""

    model: Path
    samples: Path


def make_parser() -> VerbParser:
    return VerbParser(
        EvalArguments,
        prog="kinfolk eval",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,  # a prefix of one of lm-eval's options must reach lm-eval
        epilog="Every other option goes to lm-eval unchanged (`lm-eval run --help` lists them), e.g. --model hf "
        "--model_args pretrained=DIR,peft=ADAPTER --tasks kinfolk_gsm8k --log_samples --output_path results/. With "
        "--family DIR --outcomes FILE, every size of DIR runs the task (or --heldout FILE) and FILE gets one row per "
        "example and size for `kinfolk route --outcomes FILE --models_dir DIR`.",
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


def as_size_run(config, run: SizeRun) -> None:
    """Point lm-eval's run config at one size of --family, its per-sample log written to `run.samples`; refuse
    the options that clash (another model, results lm-eval would write elsewhere, no metric to record)."""
    if config.model not in HF_MODELS:
        raise InputError(f"--model {config.model}: --family loads each size with lm-eval's hf model")
    model_args = dict(config.model_args or {})
    if "pretrained" in model_args:
        raise InputError("--model_args pretrained=: --family gives each size's folder; drop pretrained=")
    if config.output_path:
        raise InputError("--output_path: with --family the per-example results go to --outcomes")
    if config.predict_only:
        raise InputError("--predict_only: --family records each example's metric, which it leaves out")
    config.model_args = {**model_args, "pretrained": str(run.model)}
    config.output_path, config.log_samples = str(run.samples), True


def _checked(config_class, run: SizeRun | None = None):
    """lm-eval's run config, its argument errors reported as bad input and the paths checked (`check_paths`);
    under --family, pointed at one size (`as_size_run`).

    lm-eval raises `ValueError` from its argument checks (`from_cli`) and task lookup (`process_tasks`), both
    before any model loads; everything it raises there is about the command line it was given."""

    class CheckedConfig(config_class):
        @classmethod
        def from_cli(cls, namespace):
            try:
                config = super().from_cli(namespace)
            except (ValueError, TypeError, FileNotFoundError) as error:
                raise InputError(str(error)) from error
            if run is not None:
                as_size_run(config, run)
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


def run_lm_eval(lm_eval_argv: list[str], skip_default_tasks: bool = False, run: SizeRun | None = None) -> int:
    """lm-eval's CLI on `lm_eval_argv` with kinfolk's tasks and checks (under --family, on one size: `run`);
    returns its exit code and leaves the process as it found it."""
    import lm_eval.config.evaluate_config as evaluate_config
    import lm_eval.tasks

    saved = sys.argv, lm_eval.tasks.TaskManager, os.environ.get(ALLOW_ENV), evaluate_config.EvaluatorConfig
    lm_eval.tasks.TaskManager = _with_kinfolk_tasks(lm_eval.tasks.TaskManager, not skip_default_tasks)
    evaluate_config.EvaluatorConfig = _checked(evaluate_config.EvaluatorConfig, run)
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


def heldout_options(lm_eval_argv: list[str]) -> argparse.Namespace:
    """The lm-eval options that apply to --heldout (--device, --batch_size); any other is refused, as no lm-eval
    task runs."""
    parser = argparse.ArgumentParser(prog="kinfolk eval", add_help=False, allow_abbrev=False)
    parser.add_argument("--device", default=None)
    parser.add_argument("--batch_size", "-b", type=int, default=8)
    options, rest = parser.parse_known_args(lm_eval_argv)
    if rest:
        raise InputError(f"{' '.join(rest)}: --heldout runs no lm-eval task; only --device and --batch_size apply")
    if options.batch_size < 1:
        raise InputError(f"--batch_size must be at least 1 with --heldout, got {options.batch_size}")
    return options


def evaluate_family(options: EvalArguments, lm_eval_argv: list[str]) -> int:
    """--family: every size on the task (or --heldout file), its outcomes written to --outcomes."""
    from kinfolk.plugins.adapt import family_eval
    from kinfolk.plugins.adapt.outcomes import RATING_HINT

    if not options.outcomes:
        raise InputError("--family needs --outcomes (the .jsonl file `kinfolk route` reads)")
    sizes = family_eval.family_sizes(options.family)
    check_destination(options.outcomes, options.overwrite)
    chosen = {"level_field": options.level_field}
    if options.heldout:
        if options.outcome_metric or options.outcome_filter:
            raise InputError("--outcome_metric and --outcome_filter choose among a task's scores; --heldout has none")
        heldout = heldout_options(lm_eval_argv)
        chosen |= {"batch_size": heldout.batch_size, "device": heldout.device}
        outcomes = family_eval.heldout_outcomes(sizes, options.heldout, **chosen)
        print(family_eval.chat_template_note(options.heldout), file=sys.stderr)
    else:
        chosen |= {"metric": options.outcome_metric, "filter_name": options.outcome_filter}
        outcomes = []
        scratch = staging_path(Path(options.outcomes), "samples")  # beside --outcomes; a dead run's is cleaned
        try:
            for size in sizes:
                run = SizeRun(size.path, scratch / size.name)
                code = run_lm_eval(lm_eval_argv, options.skip_default_tasks, run)
                if code:
                    return code
                outcomes += family_eval.sample_outcomes(size, family_eval.read_sample_logs(run.samples), **chosen)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    written = family_eval.write_outcomes(
        outcomes,
        [size.name for size in sizes],
        options.outcomes,
        calibration_share=options.calibration_share,
        seed=options.split_seed,
        overwrite=options.overwrite,
    )
    print(outcomes_summary(written))
    route = f"kinfolk route --outcomes {written.path} --models_dir {options.family} --out routing/"
    if not written.levels:
        route += f" {RATING_HINT} MODEL"  # no level column: route rates each prompt
    if written.mean_loss is not None:
        route += f" {LOSS_HINT}"  # held-out perplexity: exp(−loss) is tiny for weak sizes; the loss separates them
    print(f"wrote {written.path}; next: {route}", file=sys.stderr)
    return 0


def outcomes_summary(written: OutcomesWritten) -> str:
    """Per size, its mean `correct` (and mean per-token loss, where measured) on each split
    (`family_eval.OutcomesWritten`), with the digits that tell the sizes apart (`kinfolk.digits`)."""
    counts = ", ".join(f"{split} {count} examples" for split, count in written.examples.items())
    tables = {"mean correct": written.mean_correct, "mean loss per token": written.mean_loss or {}}
    tables = {name: table for name, table in tables.items() if table}
    header = " | ".join(f"{split} {name}" for name in tables for split in ("calibration", "test"))
    lines = [f"| size | {header} |  ({counts})", "|---|" + "---|" * 2 * len(tables)]
    specs = {name: distinct_format(v for m in table.values() for v in m.values()) for name, table in tables.items()}
    for size in written.mean_correct:
        values = [shown(table[size][split], specs[name]) for name, table in tables.items() for split in
                  ("calibration", "test")]  # fmt: skip
        lines.append(f"| {size} | {' | '.join(values)} |")
    return "\n".join(lines)


FAMILY_ONLY = ("outcomes", "overwrite", "heldout", "level_field", "calibration_share", "split_seed", "outcome_metric",
               "outcome_filter")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    (options,), lm_eval_argv = make_parser().parse_known(argv)
    if options.family:
        return evaluate_family(options, lm_eval_argv)
    defaults = EvalArguments()
    stray = [name for name in FAMILY_ONLY if getattr(options, name) != getattr(defaults, name)]
    if stray:
        raise InputError(f"{', '.join('--' + name for name in stray)}: only with --family (a folder of sizes)")
    return run_lm_eval(lm_eval_argv, options.skip_default_tasks)
