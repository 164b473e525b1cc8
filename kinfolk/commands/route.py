"""`kinfolk route`: adaptive model-size selection over a family of sizes (ADAPT §4.4), from measured outcomes.

`--outcomes` holds one row per (split, example, model): `split` (`calibration` or `test`), `id`, `model` (a model
directory, or its name under `--models_dir`, e.g. a `kinfolk merge patch --all` output), `correct` (0/1 or a score),
`tokens` (what the example ran through that model: prompt and response), and `level` (its difficulty label) or
`prompt` (to rate it with `--difficulty rating`: one forward pass of `--rater`, `kinfolk.plugins.adapt.difficulty`).
Each example needs a row for every model. The calibration split picks, per threshold and policy (`average`,
`minimum`), the model of each level (`kinfolk.plugins.adapt.routing`); the test split measures every routing and
every fixed size at `--cost` (parameters or FLOPs × tokens, `kinfolk.plugins.adapt.cost`).

The work is `kinfolk.plugins.adapt.outcomes.route_outcomes`. Writes `routing.json` (every point, the calibration
table, per fixed size whether routing beats it) and `frontier.png` under `--out`, and prints the comparison:

    kinfolk route --outcomes outcomes.jsonl --models_dir family/ --cost flops --out routing/
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinfolk.commands.parsing import VerbParser
from kinfolk.errors import InputError
from kinfolk.plugins.adapt.cost import COST_KINDS
from kinfolk.plugins.adapt.outcomes import DIFFICULTY_SOURCES, PLOT_FILE, RESULT_FILE, route_outcomes
from kinfolk.plugins.adapt.routing import DEFAULT_THRESHOLDS, POLICIES

PROG = "kinfolk route"


@dataclass
class RouteArguments:
    outcomes: str | None = field(
        default=None,
        metadata={"help": "Rows split, id, model, correct, tokens and level (or prompt): a .jsonl/.parquet/... file."},
    )
    out: str | None = field(default=None, metadata={"help": "Output directory (routing.json, frontier.png)."})
    overwrite: bool = field(default=False, metadata={"help": "Replace an existing --out."})
    models_dir: str | None = field(
        default=None, metadata={"help": "Directory the model names live in (default: the names are paths)."}
    )
    cost: str = field(default="parameters", metadata={"help": f"Cost per token: {' or '.join(COST_KINDS)}."})
    difficulty: str = field(
        default="labels",
        metadata={"help": "labels (the `level` column) or rating (one forward pass of --rater on `prompt`)."},
    )
    rater: str | None = field(default=None, metadata={"help": "Model directory that rates difficulty (rating)."})
    rating_template: str = field(
        default="Rate the difficulty of this problem from 1 (easiest) to 5 (hardest).\n{prompt}\nDifficulty: ",
        metadata={"help": "Rating prompt, with {prompt} where the example's prompt goes."},
    )
    rating_labels: list[str] = field(
        default_factory=lambda: ["1", "2", "3", "4", "5"], metadata={"help": "Difficulty labels the rater picks from."}
    )
    thresholds: list[float] = field(
        default_factory=lambda: list(DEFAULT_THRESHOLDS), metadata={"help": "Accuracy thresholds to sweep."}
    )
    policies: list[str] = field(default_factory=lambda: list(POLICIES), metadata={"help": "Routing policies."})

    def __post_init__(self) -> None:
        if not self.outcomes or not self.out:
            raise InputError("--outcomes and --out are required")
        if self.cost not in COST_KINDS:
            raise InputError(f"--cost must be one of {', '.join(COST_KINDS)}, got {self.cost!r}")
        if self.difficulty not in DIFFICULTY_SOURCES:
            raise InputError(f"--difficulty must be one of {', '.join(DIFFICULTY_SOURCES)}, got {self.difficulty!r}")
        if self.difficulty == "rating" and not self.rater:
            raise InputError("--difficulty rating needs --rater (the model that rates each prompt)")


def route(args: RouteArguments) -> dict[str, Any]:
    """`kinfolk.plugins.adapt.outcomes.route_outcomes` with this verb's arguments."""
    return route_outcomes(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args)})


def summary(result: dict[str, Any]) -> str:
    """Per fixed size: its test accuracy and cost, and per policy whether a routing beats it and by how much."""
    lines = [f"| model | accuracy | minimum accuracy | {result['cost']} per example | " + " | ".join(
        f"{policy}: beaten, gain at its cost" for policy in result["dominance"]) + " |"]  # fmt: skip
    lines.append("|" + "---|" * (4 + len(result["dominance"])))
    for model, point in result["fixed"].items():
        cells = []
        for verdicts in result["dominance"].values():
            verdict = verdicts[model]
            gain = "n/a" if verdict["gain_at_cost"] is None else f"{verdict['gain_at_cost']:+.3f}"
            cells.append(f"{'yes' if verdict['dominated'] else 'no'}, {gain}")
        lines.append(
            f"| {model} | {point['accuracy']:.3f} | {point['minimum_accuracy']:.3f} | {point['cost']:.4g} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    (args,) = VerbParser(RouteArguments, prog=PROG, description=__doc__.split("\n\n")[0]).parse(argv)
    result = route(args)
    print(summary(result))
    print(f"wrote {Path(args.out) / RESULT_FILE} and {PLOT_FILE}", file=sys.stderr)
    return 0
