"""Routing a family of sizes from measured outcomes (ADAPT §4.4): read, check, cost, route and measure.

`route_outcomes` takes a table with one row per (split, example, model): `split` (`calibration` or `test`), `id`,
`model` (a model directory, or its name under `models_dir`), `correct` (0/1 or a score; with `score="loss"`,
`nll` and `scored_tokens` instead: the example's per-token loss, lower is better), `tokens` (what the example
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
from kinfolk.hints import suggest
from kinfolk.inputs import check_model
from kinfolk.plugins.adapt.cost import model_cost
from kinfolk.plugins.adapt.routing import POLICIES, SCORE_SCALES, Outcomes, frontier, plot_frontier

RESULT_FILE, PLOT_FILE = "routing.json", "frontier.png"
SPLITS = ("calibration", "test")
DIFFICULTY_SOURCES = ("labels", "rating")
REQUIRED = ("split", "id", "model", "tokens")
SCORE_COLUMNS = {"correct": ("correct",), "loss": ("nll", "scored_tokens")}  # what each --score reads
RATING_HINT = f"{suggest('--difficulty rating', 'route')} {suggest('--rater', 'route')}"
RATING_TEMPLATE = "Rate the difficulty of this problem from 1 (easiest) to 5 (hardest).\n{prompt}\nDifficulty: "
RATING_LABELS = ("1", "2", "3", "4", "5")


def row_score(row: dict[str, Any], score: str) -> float:
    """The routed score of one outcomes row, higher is better: `correct`, or for `loss` −nll / scored_tokens.

    >>> row_score({"correct": 0.25, "nll": 6.0, "scored_tokens": 3}, "loss")
    -2.0
    """
    if score == "loss":
        return -float(row["nll"]) / float(row["scored_tokens"])
    return float(row["correct"])


def read_outcomes(path: str, difficulty: str, score: str = "correct") -> dict[str, dict[str, Any]]:
    """Per split: `{"examples": {id: {"level", "prompt"}}, "rows": {(id, model): (score, tokens)}, "carries_loss"}`,
    checked; the score is `row_score`'s, and `carries_loss` says whether every row could be routed on its loss."""
    from kinfolk.data import load_data

    needed = (*REQUIRED, *SCORE_COLUMNS[score], "level" if difficulty == "labels" else "prompt")
    splits: dict[str, dict[str, Any]] = {split: {"examples": {}, "rows": {}, "carries_loss": True} for split in SPLITS}
    for number, row in enumerate(load_data(path).to_list(), start=1):

        def refuse(problem: str, number: int = number) -> DatasetFormatError:
            return DatasetFormatError(f"{path}: row {number} {problem}", path=path)

        missing = [name for name in needed if row.get(name) is None]
        if missing == ["level"]:  # outcomes without difficulty labels: the rater can judge each prompt instead
            raise refuse(f"has no level (the difficulty label); to rate each prompt instead pass {RATING_HINT} MODEL")
        if missing:
            raise refuse(f"has no {', '.join(missing)}")
        if row["split"] not in splits:
            raise refuse(f"has split {row['split']!r}; expected one of {', '.join(SPLITS)}")
        split = splits[row["split"]]
        split["carries_loss"] &= all(row.get(name) is not None for name in SCORE_COLUMNS["loss"])
        example = {"level": row.get("level"), "prompt": row.get("prompt")}
        if split["examples"].setdefault(str(row["id"]), example) != example:
            raise refuse(f"gives example {row['id']!r} another level or prompt")
        key = (str(row["id"]), str(row["model"]))
        if key in split["rows"]:
            raise refuse(f"repeats example {row['id']!r} of model {row['model']!r}")
        try:
            split["rows"][key] = (row_score(row, score), float(row["tokens"]))
        except (TypeError, ValueError, ZeroDivisionError):
            values = ", ".join(f"{name} {row[name]!r}" for name in (*SCORE_COLUMNS[score], "tokens"))
            raise refuse(f"has a non-numeric or zero score or tokens ({values})") from None
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
    thresholds: Sequence[float] | None = None,
    policies: Sequence[str] = POLICIES,
    score: str = "correct",
    overwrite: bool = False,
) -> dict[str, Any]:
    """Read the outcomes, find each model's cost, route, measure, and write `routing.json` and `frontier.png`
    under `out`; returns what `routing.json` holds. `thresholds` default to the calibration table's own values
    (`routing.data_thresholds`). With `score="loss"` every accuracy field of the result holds −loss per token
    (routing keeps what clears a threshold: higher is better) and `score` says so; `kinfolk route` prints and
    plots the loss itself."""
    out = check_destination(out, overwrite)
    if models_dir and not Path(models_dir).is_dir():
        raise MissingInputError(f"--models_dir {models_dir}: no such directory", path=models_dir)
    if difficulty == "rating":
        check_model(rater, "the --rater", tokenizer=True)
    if score not in SCORE_COLUMNS:
        raise InputError(f"--score must be one of {', '.join(SCORE_COLUMNS)}, got {score!r}")
    splits = read_outcomes(outcomes, difficulty, score)
    names = sorted({model for split in splits.values() for _, model in split["rows"]})
    directories = {name: Path(models_dir) / name if models_dir else Path(name) for name in names}
    costs = {name: model_cost(directory, f"--outcomes model {name!r}") for name, directory in directories.items()}
    models = sorted(names, key=lambda name: (costs[name].forward_parameters, name))  # cheapest first
    carries_loss = all(split["carries_loss"] for split in splits.values())
    result: dict[str, Any] = {"cost": cost, "difficulty": difficulty, "score": score, "carries_loss": carries_loss}
    measured = {}
    for name, split in splits.items():
        if difficulty == "rating":
            prompts = {i: example["prompt"] for i, example in split["examples"].items()}
            levels = _rated_levels(rater, rating_template, rating_labels, prompts)
            result[f"{name}_levels"] = levels
        else:
            levels = {i: example["level"] for i, example in split["examples"].items()}
        measured[name] = _outcomes(split, models, costs, cost, levels)
    chosen_thresholds = None if thresholds is None else list(thresholds)
    if chosen_thresholds is not None and score == "loss":  # thresholds are given as losses: route on −loss
        chosen_thresholds = [-value for value in chosen_thresholds]
    result.update(frontier(measured["calibration"], measured["test"], chosen_thresholds, list(policies)))
    result["model_costs"] = {name: vars(costs[name]) for name in models}
    with atomic_directory(out, overwrite=overwrite) as staging:
        write_json(staging / RESULT_FILE, result)
        plot_frontier(result, staging / PLOT_FILE, f"{cost} per example", SCORE_SCALES[score])
    return result
