"""`kinfolk drift`: retained KL at matched target scores across methods and seeds (`kinfolk.drift`).

    kinfolk drift --run atlas 1 runs/atlas-s1 --run atlas 2 runs/atlas-s2 \\
        --run lora 1 runs/lora-s1 --run lora 2 runs/lora-s2 \\
        --method atlas --target lm_eval/kinfolk_mbpp_plus/pass_at_1_count --out reports/mbpp
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from kinfolk.atomic import check_destination
from kinfolk.commands.parsing import VerbParser
from kinfolk.drift import load_run, parse_requirements, target_matched, write_report
from kinfolk.errors import InputError

NEGATIVE_START = re.compile(r"-[0-9.]")


@dataclass
class DriftArguments:
    method: str = field(metadata={"help": "the method compared with every other (numerator of the ratios)"})
    target: str = field(
        metadata={"help": "drift.jsonl key of the target score (higher is better), e.g. lm_eval/<task>/<metric>_count"}
    )
    out: str = field(metadata={"help": "directory for report.md, report.json and drift.png"})
    run: list[str] = field(
        default_factory=list,
        metadata={
            "action": "append",
            "metavar": "METHOD SEED PATH",
            "help": "a run directory (or its drift.jsonl) with its method and seed; repeat per run",
        },
    )
    kl: str = field(default="retained_kl", metadata={"help": "drift.jsonl key of the retained KL"})
    requirements: str | None = field(
        default=None,
        metadata={
            "help": 'target levels: "148:160" (integers, inclusive) or "0.4,0.5" (negative ones too: "-2.1,-1.9"); '
            "default: the range every run covers after step 0 (every integer for count scores, else 11 levels)"
        },
    )
    bootstrap: int = field(default=2000, metadata={"help": "bootstrap resamples over seeds (the t-interval's check)"})
    seed: int = field(default=0, metadata={"help": "bootstrap seed"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --out"})

    def __post_init__(self) -> None:
        if self.bootstrap < 1:
            raise ValueError(f"--bootstrap must be at least 1, got {self.bootstrap}")


def attach_negative_values(argv: list[str], flag: str) -> list[str]:
    """`FLAG -0.5,-0.2` as `FLAG=-0.5,-0.2`: argparse takes a value starting with '-' for an option unless it is one
    plain negative number, so a list or range of negative levels needs the '=' joined for it."""
    joined, index = [], 0
    while index < len(argv):
        if argv[index] == flag and index + 1 < len(argv) and NEGATIVE_START.match(argv[index + 1]):
            joined.append(f"{flag}={argv[index + 1]}")
            index += 2
        else:
            joined.append(argv[index])
            index += 1
    return joined


def main(argv: list[str] | None = None) -> int:
    argv = attach_negative_values(list(sys.argv[1:] if argv is None else argv), "--requirements")
    (args,) = VerbParser(DriftArguments, prog="kinfolk drift", description=__doc__.split("\n\n")[0]).parse(argv)
    if not args.run:
        raise InputError("no --run METHOD SEED PATH given; pass one per run")
    malformed = [" ".join(run) for run in args.run if len(run) != 3]
    if malformed:
        raise InputError(f"--run takes METHOD SEED PATH, got {malformed[0]!r}")
    out = check_destination(args.out, args.overwrite)
    requirements = parse_requirements(args.requirements) if args.requirements else None
    runs = [load_run(method, seed, path, args.target, args.kl) for method, seed, path in args.run]
    report = target_matched(
        runs, args.method, requirements, n_resamples=args.bootstrap, seed=args.seed, target=args.target, kl=args.kl
    )
    print(write_report(report, out, overwrite=args.overwrite))
    print(f"written to {out}")
    return 0
