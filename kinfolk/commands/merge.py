"""`kinfolk merge <op> CONFIG.yaml --out DIR [--overwrite]`: the ADAPT merges from the command line.

Operations: init-student, delta, delta-cosine (writes a JSON file), apply-delta, patch (`--all` writes every
size k = 0..M into DIR/k*/ plus DIR/family.json) and interpolate. `--dry-run` checks the inputs and prints the
plan without writing anything.
"""

from __future__ import annotations

import argparse
import json
import sys

from kinfolk.atomic import OutputExistsError
from kinfolk.layout import UnsupportedArchitectureError
from kinfolk.plugins.adapt.api import merge
from kinfolk.plugins.adapt.checkpoint import CheckpointError, LayerMapMismatchError, TensorMismatchError
from kinfolk.plugins.adapt.config import CONFIGS, MergeConfigError, load_config
from kinfolk.plugins.adapt.execute import MergeError
from kinfolk.plugins.adapt.layer_map import LayerMapError
from kinfolk.plugins.adapt.plan import build_plan

USER_ERRORS = (
    MergeConfigError,
    CheckpointError,
    TensorMismatchError,
    LayerMapMismatchError,
    LayerMapError,
    UnsupportedArchitectureError,
    OutputExistsError,
    MergeError,
    FileNotFoundError,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kinfolk merge", description=__doc__.split("\n\n")[0])
    parser.add_argument("op", choices=list(CONFIGS), help="merge operation")
    parser.add_argument("config", help="YAML config of the operation")
    parser.add_argument("--out", help="output directory (a JSON file for delta-cosine)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    parser.add_argument("--all", dest="all_sizes", action="store_true", help="patch: write every size k = 0..M")
    parser.add_argument("--dry-run", action="store_true", help="check the inputs, print the plan, write nothing")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.out is None and not args.dry_run:
        parser.error("--out is required (or pass --dry-run)")
    try:
        config = load_config(args.op, args.config)
        if args.dry_run:
            if args.op == "delta-cosine":
                parser.error("--dry-run does not apply to delta-cosine")
            print(build_plan(config, args.all_sizes).describe())
            return 0
        result = merge(config, args.out, args.overwrite, args.all_sizes, progress=not args.no_progress)
    except USER_ERRORS as error:
        print(f"kinfolk merge {args.op}: error: {error}", file=sys.stderr)
        return 2
    if args.op == "delta-cosine":
        layers = " ".join(
            f"{row['cosine']:.3f}" if row["cosine"] is not None else "nan" for row in result["per_layer"]
        )
        print(json.dumps({"cosine": result["cosine"]}))
        print(f"per layer: {layers}", file=sys.stderr)
    else:
        print(f"wrote {result}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
