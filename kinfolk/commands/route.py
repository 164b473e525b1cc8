"""`kinfolk route`: adaptive model-size selection over a family of sizes (ADAPT §4.4), from measured outcomes.

`--outcomes` holds one row per (split, example, model): `split` (`calibration` or `test`), `id`, `model` (a model
directory, or its name under `--models_dir`, e.g. a `kinfolk merge patch --all` output), `correct` (0/1 or a score),
`tokens` (what the example ran through that model: prompt and response), and `level` (its difficulty label) or
`prompt` (to rate it with `--difficulty rating`: one forward pass of `--rater`, `kinfolk.plugins.adapt.difficulty`).
Each example needs a row for every model. The calibration split picks, per threshold and policy (`average`,
`minimum`), the model of each level (`kinfolk.plugins.adapt.routing`); the test split measures every routing and
every fixed size at `--cost` (parameters or FLOPs × tokens, `kinfolk.plugins.adapt.cost`).

Writes `routing.json` (every point, the calibration table, per fixed size whether routing beats it) and
`frontier.png` under `--out`, and prints the comparison:

    kinfolk route --outcomes outcomes.jsonl --models_dir family/ --cost flops --out routing/
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kinfolk.atomic import atomic_directory, check_destination, write_json
from kinfolk.commands.parsing import VerbParser
from kinfolk.errors import DatasetFormatError, EmptyDatasetError, InputError, MissingInputError
from kinfolk.inputs import check_model
from kinfolk.plugins.adapt.cost import COST_KINDS, model_cost
from kinfolk.plugins.adapt.routing import DEFAULT_THRESHOLDS, POLICIES, Outcomes, frontier, plot_frontier

PROG = "kinfolk route"
RESULT_FILE, PLOT_FILE = "routing.json", "frontier.png"
SPLITS = ("calibration", "test")
DIFFICULTY_SOURCES = ("labels", "rating")


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


REQUIRED = ("split", "id", "model", "correct", "tokens")


def read_outcomes(path: str, difficulty: str) -> dict[str, dict[str, Any]]:
    """Per split: `{"examples": {id: {"level", "prompt"}}, "rows": {(id, model): (correct, tokens)}}`, checked."""
    from kinfolk.data import load_data

    needed = (*REQUIRED, "level" if difficulty == "labels" else "prompt")
    splits: dict[str, dict[str, Any]] = {split: {"examples": {}, "rows": {}} for split in SPLITS}
    for number, row in enumerate(load_data(path).to_list(), start=1):

        def refuse(problem: str, number: int = number) -> DatasetFormatError:
            return DatasetFormatError(f"{path}: row {number} {problem}", path=path)

        missing = [name for name in needed if row.get(name) is None]
        if missing:
            raise refuse(f"has no {', '.join(missing)}")
        if row["split"] not in splits:
            raise refuse(f"has split {row['split']!r}; expected one of {', '.join(SPLITS)}")
        split = splits[row["split"]]
        example = {"level": row.get("level"), "prompt": row.get("prompt")}
        if split["examples"].setdefault(str(row["id"]), example) != example:
            raise refuse(f"gives example {row['id']!r} another level or prompt")
        key = (str(row["id"]), str(row["model"]))
        if key in split["rows"]:
            raise refuse(f"repeats example {row['id']!r} of model {row['model']!r}")
        try:
            split["rows"][key] = (float(row["correct"]), float(row["tokens"]))
        except (TypeError, ValueError):
            raise refuse(f"has a non-numeric correct or tokens ({row['correct']!r}, {row['tokens']!r})") from None
    for name, split in splits.items():
        if not split["examples"]:
            raise EmptyDatasetError(f"{path}: no {name} rows", path=path)
    return splits


def _outcomes(split: dict[str, Any], models: list[str], costs: dict, kind: str, levels: dict) -> Outcomes:
    ids = list(split["examples"])
    correct, cost = [], []
    for example in ids:
        absent = [model for model in models if (example, model) not in split["rows"]]
        if absent:
            raise InputError(f"example {example!r} has no outcome for model(s) {absent}")
        correct.append([split["rows"][example, model][0] for model in models])
        cost.append([costs[model].of(split["rows"][example, model][1], kind) for model in models])
    return Outcomes(tuple(models), [levels[example] for example in ids], correct, cost)


def _rated_levels(args: RouteArguments, prompts: dict[str, str]) -> dict[str, str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kinfolk.plugins.adapt.difficulty import rate_difficulty

    rater = AutoModelForCausalLM.from_pretrained(args.rater)
    ids = list(prompts)
    rated = rate_difficulty(
        rater, AutoTokenizer.from_pretrained(args.rater), [prompts[i] for i in ids], args.rating_template,
        args.rating_labels,
    )  # fmt: skip
    return dict(zip(ids, rated))


def route(args: RouteArguments) -> dict[str, Any]:
    """Read the outcomes, find each model's cost, route, measure, and write `routing.json` and `frontier.png`."""
    out = check_destination(args.out, args.overwrite)
    if args.models_dir and not Path(args.models_dir).is_dir():
        raise MissingInputError(f"--models_dir {args.models_dir}: no such directory", path=args.models_dir)
    if args.difficulty == "rating":
        check_model(args.rater, "the --rater", tokenizer=True)
    splits = read_outcomes(args.outcomes, args.difficulty)
    names = sorted({model for split in splits.values() for _, model in split["rows"]})
    directories = {name: Path(args.models_dir) / name if args.models_dir else Path(name) for name in names}
    costs = {name: model_cost(directory, f"--outcomes model {name!r}") for name, directory in directories.items()}
    models = sorted(names, key=lambda name: (costs[name].parameters, name))  # smallest first
    result: dict[str, Any] = {"cost": args.cost, "difficulty": args.difficulty}
    outcomes = {}
    for name, split in splits.items():
        if args.difficulty == "rating":
            levels = _rated_levels(args, {i: example["prompt"] for i, example in split["examples"].items()})
            result[f"{name}_levels"] = levels
        else:
            levels = {i: example["level"] for i, example in split["examples"].items()}
        outcomes[name] = _outcomes(split, models, costs, args.cost, levels)
    result.update(frontier(outcomes["calibration"], outcomes["test"], args.thresholds, args.policies))
    result["model_costs"] = {name: vars(costs[name]) for name in models}
    with atomic_directory(out, overwrite=args.overwrite) as staging:
        write_json(staging / RESULT_FILE, result)
        plot_frontier(result, staging / PLOT_FILE, f"{args.cost} per example")
    return result


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
