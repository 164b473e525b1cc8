"""`kinfolk merge <op> CONFIG.yaml --out DIR [--overwrite]`: the ADAPT merges from the command line.

Operations: init-student, delta, apply-delta, patch (`--all` writes every size k = 0..M into DIR/k*/ plus
DIR/family.json) and interpolate, each configured by its typed config (`kinfolk.plugins.adapt.config`). `--dry-run`
checks the inputs and prints the plan without writing anything. `kinfolk merge delta-cosine CONFIG.yaml --out
FILE.json` is the diagnostic beside them: how well two deltas agree (prints the overall cosine as JSON).
`--dry-run` counts each output's tensors by their inputs; with `--verbose` it lists every tensor's formula.
`kinfolk merge OP --help` lists OP's CONFIG.yaml keys.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap
from dataclasses import dataclass, field

from kinfolk.commands.parsing import VerbParser
from kinfolk.errors import InputError
from kinfolk.hints import suggest
from kinfolk.plugins.adapt.config import CONFIGS, DeltaCosineConfig, load_config

DRY_RUN_HINT = suggest("--dry-run", "merge patch")

OPERATIONS = (*CONFIGS, DeltaCosineConfig.op)


@dataclass
class MergeArguments:
    out: str | None = field(default=None, metadata={"help": "output directory (a JSON file for delta-cosine)"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing output"})
    all: bool = field(default=False, metadata={"help": "patch: write every size k = 0..M"})
    dry_run: bool = field(default=False, metadata={"help": "check the inputs, print the plan, write nothing"})
    no_progress: bool = field(default=False, metadata={"help": "no progress bar"})
    verbose: bool = field(
        default=False,
        metadata={
            "help": "show everything: the libraries' output (else OUT.run.log beside it) and, with --dry-run, every "
            "output tensor's formula"
        },
    )


def config_keys(op: str) -> str:
    """The CONFIG.yaml keys of one operation, with their help (for `kinfolk merge OP --help`)."""
    config_class = CONFIGS.get(op) or DeltaCosineConfig
    lines = [f"{op}: {config_class.__doc__.splitlines()[0]}", "CONFIG.yaml keys:"]
    for item in dataclasses.fields(config_class):
        required = item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING
        default = "required" if required else f"default {item.default!r}"
        text = f"{item.name}: {item.metadata.get('help', '')} ({default})"
        lines.append(textwrap.fill(text, width=100, initial_indent="  ", subsequent_indent="      "))
    return "\n".join(lines)


def file_keys(op: str | None) -> dict[str, str]:
    """The CONFIG.yaml keys of operation `op` (of every operation when None), each with the file it belongs in: a
    key given as a command-line option is pointed there."""
    if op is not None:
        config_class = CONFIGS.get(op) or DeltaCosineConfig
        return {item.name: f"the {op} config file (CONFIG.yaml)" for item in dataclasses.fields(config_class)}
    classes = (*CONFIGS.values(), DeltaCosineConfig)
    return {item.name: "the merge config file (CONFIG.yaml)" for cls in classes for item in dataclasses.fields(cls)}


def make_parser(argv: list[str] | None = None) -> VerbParser:
    """The verb's parser; when `argv` names an operation, its help ends with that operation's config keys."""
    named = [op for op in (argv or []) if op in OPERATIONS][:1]
    epilog = config_keys(named[0]) if named else "`kinfolk merge OP --help` lists OP's CONFIG.yaml keys."
    parser = VerbParser(
        MergeArguments,
        file_keys=file_keys(named[0] if named else None),
        prog="kinfolk merge",
        description=__doc__.split("\n\n")[0],
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("op", choices=OPERATIONS, help="merge operation (or the delta-cosine diagnostic)")
    parser.add_argument("config_file", metavar="CONFIG.yaml", help="YAML config of the operation")
    return parser


def cosine(args: MergeArguments, config: DeltaCosineConfig) -> int:
    from kinfolk.plugins.adapt.cosine import write_delta_cosine

    if args.dry_run:
        raise InputError("--dry-run does not apply to delta-cosine (it writes one small JSON file)")
    result = write_delta_cosine(config, args.out, args.overwrite, progress=not args.no_progress)
    layers = " ".join(f"{row['cosine']:.3f}" if row["cosine"] is not None else "nan" for row in result["per_layer"])
    print(json.dumps({"cosine": result["cosine"]}))
    print(f"per layer: {layers}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args, positional = make_parser(argv).parse(argv)
    # the merges' modules (torch, transformers) load once the options are parsed: `--help` stays fast
    from kinfolk.atomic import check_destination
    from kinfolk.console import log_beside, quiet
    from kinfolk.interrupt import keep
    from kinfolk.plugins.adapt.api import merge
    from kinfolk.plugins.adapt.plan import build_plan

    if args.out is None and not args.dry_run:
        raise InputError(f"--out is required (or pass {DRY_RUN_HINT})")
    if not args.dry_run:  # before the config's inputs are read, and before the log is opened beside it
        check_destination(args.out, args.overwrite)
    config = load_config(positional.op, positional.config_file)
    if isinstance(config, DeltaCosineConfig):
        return cosine(args, config)
    if args.dry_run:
        print(build_plan(config, args.all).describe(args.out, every_tensor=args.verbose))
        return 0
    keep(f"nothing at {args.out} (merges write whole or not at all; a rerun starts the merge again)")
    with quiet(log_beside(args.out), "kinfolk merge", verbose=args.verbose):
        written = merge(config, args.out, args.overwrite, args.all, progress=not args.no_progress)
    print(f"wrote {written}", file=sys.stderr)
    return 0
