"""`kinfolk route`: adaptive model-size selection over a family of sizes (ADAPT §4.4), from measured outcomes, held
against the best random mix of fixed sizes at equal cost. It prints every fixed size and every routed point in cost
order with its test score and the random-mix hull at its cost: the best score any random mix of two fixed sizes
reaches at that expected cost, every value with enough digits to tell it from the others (`kinfolk.digits`). A routed point above the hull is a gain from routing; a router that does not beat the
hull gives nothing a user could not get by sending examples to sizes at random, and the command says so.

`--outcomes` holds one row per (split, example, model): `split` (`calibration` or `test`), `id`, `model` (a model
directory, or its name under `--models_dir`, e.g. a `kinfolk merge patch --all` output), `correct` (0/1 or a score
in [0, 1]; `--score loss` routes on `nll` / `scored_tokens` instead, the per-token loss, lower is better), `tokens` (what the example ran through that model: prompt and response), and `level` (its difficulty
label) or `prompt` (to rate it with `--difficulty rating`: one forward pass of `--rater`,
`kinfolk.plugins.adapt.difficulty`). Each example needs a row for every model. `kinfolk eval --family DIR
--outcomes outcomes.jsonl` writes such a file from an lm-eval task or held-out perplexity over every size of DIR.
Held-out perplexity rows carry both; their `correct` (exp of minus the
per-token loss) is tiny for a weak size, so `--score loss` is the scale to route them on, and the command says so
when it was not chosen. Thresholds default to the calibration table's own values at 101 quantiles
(`routing.data_thresholds`); given ones are read on the score's scale (losses with `--score loss`).
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
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinfolk.commands.parsing import VerbParser
from kinfolk.digits import distinct_format, shown
from kinfolk.errors import InputError
from kinfolk.hints import suggest
from kinfolk.plugins.adapt.cost import COST_KINDS
from kinfolk.plugins.adapt.outcomes import DIFFICULTY_SOURCES, PLOT_FILE, RESULT_FILE, SCORE_COLUMNS, route_outcomes
from kinfolk.plugins.adapt.routing import POLICIES, SCORE_SCALES, ScoreScale

PROG = "kinfolk route"
SCORE_HINT = suggest("--score loss", "route")
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
    cost: str = field(
        default="parameters",
        metadata={"help": f"Cost per token: {' or '.join(COST_KINDS)} (of the parameters a token multiplies with)."},
    )
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
    thresholds: list[float] | None = field(
        default=None,
        metadata={
            "help": "Thresholds to sweep, on the score's scale (losses with --score loss); unset: the calibration "
            "table's own values at 101 quantiles."
        },
    )
    policies: list[str] = field(default_factory=lambda: list(POLICIES), metadata={"help": "Routing policies."})
    score: str = field(
        default="correct",
        metadata={
            "help": "What to route on: correct (higher is better) or loss (nll / scored_tokens per example, lower "
            "is better: held-out perplexity rows)."
        },
    )

    def __post_init__(self) -> None:
        if not self.outcomes or not self.out:
            raise InputError("--outcomes and --out are required")
        if self.cost not in COST_KINDS:
            raise InputError(f"--cost must be one of {', '.join(COST_KINDS)}, got {self.cost!r}")
        if self.difficulty not in DIFFICULTY_SOURCES:
            raise InputError(f"--difficulty must be one of {', '.join(DIFFICULTY_SOURCES)}, got {self.difficulty!r}")
        if self.score not in SCORE_COLUMNS:
            raise InputError(f"--score must be one of {', '.join(SCORE_COLUMNS)}, got {self.score!r}")
        if self.difficulty == "rating" and not self.rater:
            raise InputError("--difficulty rating needs --rater (the model that rates each prompt)")


def route(args: RouteArguments) -> dict[str, Any]:
    """`kinfolk.plugins.adapt.outcomes.route_outcomes` with this verb's arguments."""
    return route_outcomes(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args)})


def _label(assignment: dict) -> str:
    return " ".join(f"{level}→{model}" for level, model in assignment.items())


def _scale(result: dict[str, Any]) -> ScoreScale:
    return SCORE_SCALES[result.get("score", "correct")]


def summary(result: dict[str, Any]) -> str:
    """Every fixed size and routed point in cost order: score, worst level's score, cost, the random-mix hull at
    its cost and the gain over it (positive: better than the hull), each on the score's own scale with the digits
    that tell the values apart; then, per policy, whether any routing beats the hull."""
    scale = _scale(result)
    points = [("fixed", model, point) for model, point in result["fixed"].items()]
    points += [(policy, _label(p["assignment"]), p) for policy, routed in result["routed"].items() for p in routed]
    points.sort(key=lambda entry: (entry[2]["cost"], entry[0] != "fixed", entry[1]))
    scores = [scale.shown(p[key]) for _, _, p in points for key in ("accuracy", "minimum_accuracy", "hull_accuracy")]
    spec = distinct_format(scores)
    gain_spec = distinct_format(p["gain_over_hull"] for _, _, p in points).removeprefix("#")  # "+0", not "+0.00"
    worst = "maximum" if scale.sign < 0 else "minimum"
    lines = [
        f"| {result['cost']} per example | kind | size or routing | {scale.name} | {worst} {scale.name} | "
        "random-mix hull | gain over hull |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, name, point in points:
        values = [shown(scale.shown(point[key]), spec) for key in ("accuracy", "minimum_accuracy", "hull_accuracy")]
        gain = "n/a" if point["gain_over_hull"] is None else f"{point['gain_over_hull']:+{gain_spec}}"
        lines.append(f"| {point['cost']:.4g} | {kind} | {name} | {' | '.join(values)} | {gain} |")
    lines.append("")
    lines += [hull_verdict(policy, routed, scale) for policy, routed in result["routed"].items()]
    return "\n".join(lines)


def hull_verdict(policy: str, points: list[dict[str, Any]], scale: ScoreScale = SCORE_SCALES["correct"]) -> str:
    """One plain sentence: does any routed point of `policy` beat the best random mix of fixed sizes at its cost?"""
    above = [p for p in points if p["gain_over_hull"] is not None and p["gain_over_hull"] > HULL_TOLERANCE]
    if not above:
        return (
            f"{policy}: no routing beats the best random mix of two fixed sizes at equal cost; it gains nothing "
            "here that mixing sizes at random would not"
        )
    best = max(above, key=lambda p: p["gain_over_hull"])
    where = f"at {best['cost']:.4g} ({_label(best['assignment'])})"
    better = "lower" if scale.sign < 0 else "higher"
    return (
        f"{policy}: {len(above)} of {len(points)} routings beat the best random mix of two fixed sizes at equal "
        f"cost; the best by {best['gain_over_hull']:.3g} {better} {scale.name} {where}"
    )


def score_hint(result: dict[str, Any], argv: list[str]) -> str | None:
    """The rerun to suggest when rows carrying a loss were routed on `correct` (a tiny exp(−loss) for most sizes)."""
    if result.get("score") != "correct" or not result.get("carries_loss"):
        return None
    return f"these outcomes carry each example's loss; to route on it: {PROG} {shlex.join(argv)} {SCORE_HINT}"


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    (args,) = VerbParser(RouteArguments, prog=PROG, description=__doc__.split("\n\n")[0]).parse(argv)
    result = route(args)
    print(summary(result))
    print(f"wrote {Path(args.out) / RESULT_FILE} and {PLOT_FILE}", file=sys.stderr)
    hint = score_hint(result, argv)
    if hint:
        print(hint, file=sys.stderr)
    return 0
