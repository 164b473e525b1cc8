"""`kinfolk churn FROZEN ADAPTED [COMPARATOR]`: answer churn of an adapted model against the frozen one, from lm-eval
samples files (`--log_samples`), as a markdown table; with a comparator, the paired reduction of each count
(`kinfolk.drift.churn` has the definitions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kinfolk.atomic import check_destination, write_json
from kinfolk.commands.parsing import VerbParser
from kinfolk.drift.churn import KINDS, align, churn_report, compare_churn, outcomes, read_samples
from kinfolk.errors import InputError


@dataclass
class ChurnArguments:
    metric: str | None = field(default=None, metadata={"help": "per-sample correctness metric (default: the first)"})
    filter: str | None = field(default=None, metadata={"help": "lm-eval filter to use when the task has several"})
    bootstrap: int = field(default=2000, metadata={"help": "paired-question bootstrap resamples"})
    out: str | None = field(default=None, metadata={"help": "also write the numbers as JSON here"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --out"})

    def __post_init__(self) -> None:
        if self.bootstrap < 1:
            raise ValueError(f"--bootstrap must be at least 1, got {self.bootstrap}")


def make_parser() -> VerbParser:
    parser = VerbParser(ChurnArguments, prog="kinfolk churn", description=__doc__.split("\n\n")[0])
    parser.add_argument("frozen", help="samples_<task>_*.jsonl of the frozen model")
    parser.add_argument("adapted", help="samples file of the adapted model (the method)")
    parser.add_argument("comparator", nargs="?", help="samples file of a comparator adapted from the same model")
    return parser


def _cell(interval: Mapping[str, float], percent: bool = True) -> str:
    if math.isnan(interval["estimate"]):  # a rate over no question (e.g. F when the frozen model got none right)
        return "— (no such question)"
    scale = 100.0 if percent else 1.0
    return f"{scale * interval['estimate']:.2f} [{scale * interval['low']:.2f}, {scale * interval['high']:.2f}]"


def main(argv: list[str] | None = None) -> int:
    args, files = make_parser().parse(argv)
    if args.out:
        check_destination(args.out, args.overwrite)

    def load(path):
        records = read_samples(path)
        try:
            return outcomes(records, args.metric, args.filter)
        except InputError as error:  # about a record of this file: say which file
            raise type(error)(f"{path}: {error}") from None

    frozen, adapted = load(files.frozen), load(files.adapted)
    runs = {files.frozen: frozen, files.adapted: adapted}
    if files.comparator:
        runs[files.comparator] = load(files.comparator)
    align(*runs.values(), names=list(runs))
    report: dict[str, Any] = {"adapted": churn_report(frozen, adapted, n_resamples=args.bootstrap)}
    counts = report["adapted"]
    lines = [
        f"{counts['n']} questions; frozen accuracy {100 * counts['frozen_accuracy']:.2f}%, "
        f"adapted {100 * counts['adapted_accuracy']:.2f}%",
        "",
        "| change | count | rate % [95% CI] | per |",
        "|---|---|---|---|",
    ]
    per = {"C": "question", "F": "frozen-correct", "G": "frozen-wrong", "W": "frozen-wrong"}
    lines += [f"| {kind} | {counts[kind]} | {_cell(counts[f'{kind}_rate'])} | {per[kind]} |" for kind in KINDS]
    if files.comparator:
        comparison = compare_churn(frozen, adapted, runs[files.comparator], n_resamples=args.bootstrap)
        report["comparison"] = comparison
        lines += ["", "| change | adapted | comparator | reduction % [95% CI] |", "|---|---|---|---|"]
        lines += [
            f"| {kind} | {comparison[kind]['method']} | {comparison[kind]['comparator']} | {_cell(comparison[kind])} |"
            for kind in (*KINDS, "F+G")
        ]
    print("\n".join(lines))
    if args.out:
        write_json(args.out, report)
    return 0
