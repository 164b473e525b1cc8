"""The `kinfolk <verb>` command line: one module per verb in this package (beside the helpers they share: `parsing` and
`launching`), the verb table below.

Every verb parses its options from dataclasses with TRL's parser (`kinfolk.commands.parsing.VerbParser`): each
`--x_y` option is also `--x-y`, `--config run.yaml` supplies the same keys, and `--help` lists them with their help.
One exit-code rule holds for all of them:

| exit | meaning | what is printed |
| --- | --- | --- |
| 0 | done | the verb's output |
| 1 | runtime failure (a bug, an out-of-memory) | Python's traceback |
| 1 | the disk filled during a write (`kinfolk.diskspace.DiskFullError`) | one line naming the destination |
| 2 | usage or bad input (`kinfolk.errors.InputError`, a missing file, too little free space) | one line naming the culprit |
| 130, 143 | interrupted by SIGINT (Ctrl-C) or SIGTERM (`kinfolk.interrupt`) | one line: what is kept, how to resume |

`kinfolk --debug <verb> ...` (or `KINFOLK_DEBUG=1`) shows the traceback of a bad-input error too. A verb's module is
imported only when that verb runs, which keeps `kinfolk --help` fast; and a verb module imports the training stack
(torch, transformers, TRL) only in the functions that do the work, so that its `--help` is fast too (a test checks
the light verbs' modules import no torch; `bench/bench_cli_help.py` times them). An unknown option is refused
naming the nearest known one (`kinfolk.commands.parsing`).

>>> main(["--version"])  # doctest: +SKIP
kinfolk 0.1.0
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable

from kinfolk import __version__
from kinfolk.diskspace import DiskFullError, is_disk_full
from kinfolk.errors import InputError, cli_spelling
from kinfolk.interrupt import LAUNCHED_ENV, catch_signals, exit_code, interrupted_line, start_run
from kinfolk.process_group import end_process_group

# verb -> (module with `main(argv) -> int`, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "env": ("kinfolk.commands.env", "print the installed stack, the torch device and the registered kinfolk plugins"),
    "score": ("kinfolk.commands.score", "ATLANTIS: score an SFT dataset with three models, add a weight column"),
    "sft": ("kinfolk.commands.sft", "`trl sft` with WeightedSFTTrainer (weights, prompt loss weight) and ATLAS"),
    "distil": ("kinfolk.commands.distil", "ADAPT: init-student, two-phase distillation and delta from a teacher"),
    "merge": ("kinfolk.commands.merge", "ADAPT merges: init-student, delta, apply-delta, patch, interpolate"),
    "route": (
        "kinfolk.commands.route",
        "ADAPT: per difficulty level, the smallest size accurate enough; the frontier",
    ),
    "eval": ("kinfolk.commands.eval", "lm-eval's CLI with kinfolk's adapter types and tasks registered"),
    "churn": ("kinfolk.commands.churn", "answer churn (C/F/G/W) between lm-eval sample logs, with paired intervals"),
    "drift": ("kinfolk.commands.drift", "retained KL at matched target scores across methods and seeds (report)"),
    "compare": (
        "kinfolk.commands.compare",
        "train methods x learning rates x seeds, choose rates on validation, report drift at matched gain",
    ),
    "lab": ("kinfolk.commands.lab", "the lab: build the tiny CPU-trained model family with known ground truth"),
    "demo": ("kinfolk.commands.demo", "ATLANTIS, ATLAS and ADAPT on the lab family, measured; writes report.md"),
}
DEBUG_ENV = "KINFOLK_DEBUG"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kinfolk",
        description="kinfolk: ATLANTIS weighted SFT, ATLAS adapters, ADAPT merges and drift measurement.",
        epilog="Run `kinfolk <verb> --help` for a verb's own options.",
    )
    parser.add_argument("--version", action="version", version=f"kinfolk {__version__}")
    parser.add_argument("--debug", action="store_true", help=f"show tracebacks of bad-input errors (or {DEBUG_ENV}=1)")
    verbs = parser.add_subparsers(dest="verb", metavar="<verb>")
    for name, (_, help_text) in VERBS.items():
        verbs.add_parser(name, help=help_text, add_help=False)
    return parser


def one_line(error: BaseException) -> str:
    """An error's message on one line (argparse-style messages may wrap)."""
    return " ".join(str(error).split()) or type(error).__name__


def run(prog: str, call: Callable[[], int | None], debug: bool = False, argv: list[str] | None = None) -> int:
    """Run a verb under the exit-code rule: its return code (0 for None); bad input → one line on stderr and 2;
    a full disk → one line and 1; SIGINT / SIGTERM → one line (what is kept, the command `argv` that resumes) and
    130 / 143.

    Other exceptions propagate: the process ends with Python's traceback and exit code 1. A launched process (one
    rank of `kinfolk sft` or `kinfolk distil`) that succeeded ends its process group before it returns.
    """
    debug = debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    start_run()
    try:
        # hints in errors name the flags the user types, not keyword arguments
        with catch_signals(), cli_spelling():
            code = int(call() or 0)
        if code == 0:
            end_process_group()
        return code
    except KeyboardInterrupt as error:
        if debug:
            raise
        if not os.environ.get(LAUNCHED_ENV):  # a launched process: its launcher prints the line
            print(interrupted_line(prog, error, argv if argv is not None else sys.argv[1:]), file=sys.stderr)
        return exit_code(error)
    except (InputError, FileNotFoundError) as error:
        if debug:
            raise
        print(f"{prog}: error: {one_line(error)}", file=sys.stderr)
        return 2
    except DiskFullError as error:
        if debug:
            raise
        print(f"{prog}: error: {one_line(error)}", file=sys.stderr)
        return 1
    except Exception as error:  # a full disk met outside kinfolk's atomic writers: one line too, naming the file
        if debug or not is_disk_full(error):
            raise
        where = f" while writing {error.filename}" if getattr(error, "filename", None) else ""
        print(f"{prog}: error: no space left on device{where} ({one_line(error)})", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = argv[:1] == ["--debug"]
    argv = argv[1:] if debug else argv
    if not argv or argv[0] not in VERBS:
        build_parser().parse_args(argv)  # --help, --version and unknown verbs, with argparse's own messages
        build_parser().print_help()
        return 2
    verb, module_name = argv[0], VERBS[argv[0]][0]
    return run(f"kinfolk {verb}", lambda: importlib.import_module(module_name).main(argv[1:]), debug, argv)
