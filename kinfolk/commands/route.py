"""`kinfolk route`: adaptive model-size selection over a family of sizes (ADAPT §4.4), from measured outcomes, held
against the best random mix of fixed sizes at equal cost. It prints every fixed size and every routed point in cost
order with its test accuracy and the random-mix hull at its cost: the best accuracy any random mix of two fixed sizes
reaches at that expected cost. A routed point above the hull is a gain from routing; a router that does not beat the
hull gives nothing a user could not get by sending examples to sizes at random, and the command says so.

`--outcomes` holds one row per (split, example, model): `split` (`calibration` or `test`), `id`, `model` (a model
directory, or its name under `--models_dir`, e.g. a `kinfolk merge patch --all` output), `correct` (0/1 or a score
in [0, 1]), `tokens` (what the example ran through that model: prompt and response), and `level` (its difficulty
label) or `prompt` (to rate it with `--difficulty rating`: one forward pass of `--rater`,
`kinfolk.plugins.adapt.difficulty`). Each example needs a row for every model. `kinfolk eval --family DIR
--outcomes outcomes.jsonl` writes such a file from an lm-eval task or held-out perplexity over every size of DIR.
The calibration split picks, per threshold and policy (`average`, `minimum`), the model of each level
(`kinfolk.plugins.adapt.routing`); the test split measures every routing and every fixed size at `--cost`
(parameters or FLOPs × tokens, `kinfolk.plugins.adapt.cost`) and the hull of the fixed sizes
(`kinfolk.plugins.adapt.hull`).

The work is `kinfolk.plugins.adapt.outcomes.route_outcomes`. Writes `routing.json` (every point with the hull's
accuracy at its cost and its gain over it, the hull's vertices, the calibration table, per fixed size whether
routing beats it) and `frontier.png` under `--out`, and prints the comparison:

    kinfolk eval --family family/ --outcomes outcomes.jsonl --tasks kinfolk_lab_reverse --skip_default_tasks
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
HULL_TOLERANCE = 1e-9  # a routing that reproduces a hull vertex differs from it by rounding only


@dataclass
class RouteArguments:
    outcomes: str | None = field(
        default=None,
        metadata={
            "help": "Rows split, id, model, correct, tokens and level (or prompt): a .jsonl/.parquet/... file "
            "(`kinfolk eval --family DIR --outcomes FILE` writes one)."
        },
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


def _label(assignment: dict) -> str:
    return " ".join(f"{level}→{model}" for level, model in assignment.items())


def _gain(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.3g}"


def summary(result: dict[str, Any]) -> str:
    """Every fixed size and routed point in cost order: accuracy, minimum accuracy, cost, the random-mix hull at its
    cost and the accuracy over it; then, per policy, whether any routing beats the hull."""
    points = [("fixed", model, point) for model, point in result["fixed"].items()]
    points += [(policy, _label(p["assignment"]), p) for policy, routed in result["routed"].items() for p in routed]
    points.sort(key=lambda entry: (entry[2]["cost"], entry[0] != "fixed", entry[1]))
    lines = [
        f"| {result['cost']} per example | kind | size or routing | accuracy | minimum accuracy | random-mix hull | "
        "accuracy − hull |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, name, point in points:
        hull = "n/a" if point["hull_accuracy"] is None else f"{point['hull_accuracy']:.3f}"
        lines.append(
            f"| {point['cost']:.4g} | {kind} | {name} | {point['accuracy']:.3f} | {point['minimum_accuracy']:.3f} | "
            f"{hull} | {_gain(point['gain_over_hull'])} |"
        )
    lines.append("")
    lines += [hull_verdict(policy, routed) for policy, routed in result["routed"].items()]
    return "\n".join(lines)


def hull_verdict(policy: str, points: list[dict[str, Any]]) -> str:
    """One plain sentence: does any routed point of `policy` beat the best random mix of fixed sizes at its cost?"""
    above = [p for p in points if p["gain_over_hull"] is not None and p["gain_over_hull"] > HULL_TOLERANCE]
    if not above:
        return (
            f"{policy}: no routing beats the best random mix of two fixed sizes at equal cost; it gains nothing "
            "here that mixing sizes at random would not"
        )
    best = max(above, key=lambda p: p["gain_over_hull"])
    where = f"at {best['cost']:.4g} ({_label(best['assignment'])})"
    return (
        f"{policy}: {len(above)} of {len(points)} routings beat the best random mix of two fixed sizes at equal "
        f"cost; the best by {_gain(best['gain_over_hull'])} accuracy {where}"
    )


def main(argv: list[str] | None = None) -> int:
    (args,) = VerbParser(RouteArguments, prog=PROG, description=__doc__.split("\n\n")[0]).parse(argv)
    result = route(args)
    print(summary(result))
    print(f"wrote {Path(args.out) / RESULT_FILE} and {PLOT_FILE}", file=sys.stderr)
    return 0
