"""Routing a family of sizes from measured outcomes (ADAPT §4.4): read, check, cost, route and measure.

`route_outcomes` takes a table with one row per (split, example, model): `split` (`calibration` or `test`), `id`,
`model` (a model directory, or its name under `models_dir`), `correct` (0/1 or a score), `tokens` (what the example
ran through that model) and `level` (its difficulty label) or `prompt` (rated by one forward pass of a rater,
`kinfolk.plugins.adapt.difficulty`). The calibration split picks, per threshold and policy, the model of each
level (`kinfolk.plugins.adapt.routing`); the test split measures every routing and every fixed size at the chosen
cost (`kinfolk.plugins.adapt.cost`). `kinfolk route` is its command line (`kinfolk.commands.route`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kinfolk.atomic import atomic_directory, check_destination, write_json
from kinfolk.errors import DatasetFormatError, EmptyDatasetError, InputError, MissingInputError
from kinfolk.inputs import check_model
from kinfolk.plugins.adapt.cost import model_cost
from kinfolk.plugins.adapt.routing import DEFAULT_THRESHOLDS, POLICIES, Outcomes, frontier, plot_frontier

RESULT_FILE, PLOT_FILE = "routing.json", "frontier.png"
SPLITS = ("calibration", "test")
DIFFICULTY_SOURCES = ("labels", "rating")
REQUIRED = ("split", "id", "model", "correct", "tokens")
RATING_TEMPLATE = "Rate the difficulty of this problem from 1 (easiest) to 5 (hardest).\n{prompt}\nDifficulty: "
RATING_LABELS = ("1", "2", "3", "4", "5")


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


def _rated_levels(rater: str, template: str, labels: Sequence[str], prompts: dict[str, str]) -> dict[str, str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kinfolk.plugins.adapt.difficulty import rate_difficulty

    model = AutoModelForCausalLM.from_pretrained(rater)
    ids = list(prompts)
    rated = rate_difficulty(
        model, AutoTokenizer.from_pretrained(rater), [prompts[i] for i in ids], template, list(labels)
    )
    return dict(zip(ids, rated))


def route_outcomes(
    outcomes: str,
    out: str | Path,
    *,
    models_dir: str | None = None,
    cost: str = "parameters",
    difficulty: str = "labels",
    rater: str | None = None,
    rating_template: str = RATING_TEMPLATE,
    rating_labels: Sequence[str] = RATING_LABELS,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    policies: Sequence[str] = POLICIES,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Read the outcomes, find each model's cost, route, measure, and write `routing.json` and `frontier.png`
    under `out`; returns what `routing.json` holds."""
    out = check_destination(out, overwrite)
    if models_dir and not Path(models_dir).is_dir():
        raise MissingInputError(f"--models_dir {models_dir}: no such directory", path=models_dir)
    if difficulty == "rating":
        check_model(rater, "the --rater", tokenizer=True)
    splits = read_outcomes(outcomes, difficulty)
    names = sorted({model for split in splits.values() for _, model in split["rows"]})
    directories = {name: Path(models_dir) / name if models_dir else Path(name) for name in names}
    costs = {name: model_cost(directory, f"--outcomes model {name!r}") for name, directory in directories.items()}
    models = sorted(names, key=lambda name: (costs[name].parameters, name))  # smallest first
    result: dict[str, Any] = {"cost": cost, "difficulty": difficulty}
    measured = {}
    for name, split in splits.items():
        if difficulty == "rating":
            prompts = {i: example["prompt"] for i, example in split["examples"].items()}
            levels = _rated_levels(rater, rating_template, rating_labels, prompts)
            result[f"{name}_levels"] = levels
        else:
            levels = {i: example["level"] for i, example in split["examples"].items()}
        measured[name] = _outcomes(split, models, costs, cost, levels)
    result.update(frontier(measured["calibration"], measured["test"], list(thresholds), list(policies)))
    result["model_costs"] = {name: vars(costs[name]) for name in models}
    with atomic_directory(out, overwrite=overwrite) as staging:
        write_json(staging / RESULT_FILE, result)
        plot_frontier(result, staging / PLOT_FILE, f"{cost} per example")
    return result
