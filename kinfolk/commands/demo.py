"""`kinfolk demo [--quick] [--out DIR]`: ATLANTIS, ATLAS and ADAPT on the lab family, measured against its ground
truth (`kinfolk.lab.demo.pipeline`); writes report.md, results.json and plots, and prints the headline.

A family that missed a build threshold stops the demo with one line naming the model, skill and score (exit 1),
unless `--allow-failed-family` is given; the report then says so in its first line.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from kinfolk.commands.parsing import VerbParser


@dataclass
class DemoArguments:
    quick: bool = field(default=False, metadata={"help": "The quick family and budgets (what CI runs)."})
    out: str = field(default="runs/demo", metadata={"help": "Output directory."})
    overwrite: bool = field(default=False, metadata={"help": "Replace an existing output directory."})
    seed: int = field(default=0, metadata={"help": "Seed of the family and of every run."})
    cache_dir: str | None = field(default=None, metadata={"help": "Lab family cache (default ~/.cache/kinfolk/lab)."})
    threads: int | None = field(
        default=None, metadata={"help": "torch CPU threads of the ATLAS and ADAPT stages (builds run on one)."}
    )
    allow_failed_family: bool = field(
        default=False,
        metadata={"help": "Run on a family that missed a build threshold (the report's first line then says so)."},
    )
    verbose: bool = field(
        default=False, metadata={"help": "Show the libraries' output too (by default it goes to OUT/run.log)."}
    )


def main(argv: list[str] | None = None) -> int:
    (args,) = VerbParser(DemoArguments, prog="kinfolk demo", description=__doc__.split("\n\n")[0]).parse(argv)
    import torch

    from kinfolk.atomic import check_destination, check_writable
    from kinfolk.console import LOG_FILE, quiet
    from kinfolk.interrupt import keep, with_flag
    from kinfolk.lab.demo.pipeline import DemoConfig, run_demo
    from kinfolk.lab.world.family import FamilyBelowThreshold, default_cache_dir

    if args.threads:
        torch.set_num_threads(args.threads)
    config = DemoConfig.quick_config(seed=args.seed) if args.quick else DemoConfig(seed=args.seed)
    out = check_destination(args.out, args.overwrite)
    check_writable(args.cache_dir or default_cache_dir())  # the family is built there; checked before the log opens
    keep(f"the lab family's cache and the finished stages' models and records under {out}", with_flag("--overwrite"))
    try:
        with quiet(out / LOG_FILE, "kinfolk demo", verbose=args.verbose):
            run_demo(
                out,
                config,
                cache_dir=args.cache_dir,
                overwrite=True,  # checked above, before the log was opened inside it
                allow_failed_family=args.allow_failed_family,
            )
    except FamilyBelowThreshold as error:
        print(f"kinfolk demo: {error}", file=sys.stderr)
        return 1
    print(f"report: {out / 'report.md'} (the libraries' output: {LOG_FILE} beside it)")
    return 0
