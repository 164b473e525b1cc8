"""Answer churn: how many retained answers an adapted model rewrites relative to the frozen model.

Per question, with the frozen model's answer a₀ (correct or not) and the adapted model's answer a₁:
C counts changed answers (a₁ ≠ a₀); F correct → wrong; G wrong → correct; W wrong → a different wrong answer.
F is reported per frozen-correct question and G and W per frozen-wrong question (the opportunities), C per
question. For multiple-choice tasks the answer is the option with the highest log-likelihood (conditional
choice), so C/N is conditional-choice churn. Intervals are paired-question bootstrap percentiles.

Answers come from lm-eval sample logs (`--log_samples`, or `LmEvalCallback`'s own runs): one record per
question with `doc_id`, `doc_hash`, `filtered_resps`, `filter`, `metrics` and the metric values. Runs are
matched by document hash (by `doc_id` where hashes repeat), and a question whose hash differs between runs
is an error: the two runs did not see the same data.

>>> frozen = {"q1": Outcome("4", True), "q2": Outcome("7", False), "q3": Outcome("1", False)}
>>> adapted = {"q1": Outcome("5", False), "q2": Outcome("9", False), "q3": Outcome("2", True)}
>>> counts = churn_counts(frozen, adapted)
>>> counts["C"], counts["F"], counts["G"], counts["W"]
(3, 1, 1, 1)
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kinfolk.errors import CorruptFileError, EmptyDatasetError, InputError, option_name
from kinfolk.inputs import json_document, read_json_lines
from kinfolk.stats import bootstrap_interval

KINDS = ("C", "F", "G", "W")


class MissingMetricError(InputError, KeyError):
    """A sample record without the metric asked for (a KeyError, as for a missing dict key)."""

    __str__ = Exception.__str__  # KeyError would quote the message


@dataclass(frozen=True)
class Outcome:
    """One question's answer (text, or the chosen option's index) and whether it was scored correct."""

    answer: Hashable
    correct: bool


def read_samples(path: str | Path) -> list[dict[str, Any]]:
    """Records of an lm-eval samples file (JSON lines); a missing or empty file, or a line that is not a JSON
    object, is refused naming the file (and the line)."""
    try:
        records = read_json_lines(path, "samples file", entry="a samples record (a JSON object)")
    except CorruptFileError:
        document = json_document(path)
        if isinstance(document, dict) and "results" in document:
            raise CorruptFileError(
                f"{path} is an lm-eval results file (one JSON document with 'results'), not a samples log: churn "
                "reads the samples_<task>_*.jsonl files lm-eval writes beside it with --log_samples",
                path=path,
            ) from None
        raise
    if not records:
        raise EmptyDatasetError(f"{path} holds no sample records", path=path)
    return records


def _answer(record: dict[str, Any]) -> Hashable:
    response = record["filtered_resps"]
    # multiple choice: one (log-likelihood, is_greedy) pair per option; the answer is the most likely option
    if isinstance(response, list) and response and all(isinstance(item, (list, tuple)) for item in response):
        return int(np.argmax([float(item[0]) for item in response]))
    if isinstance(response, list):
        response = response[0] if len(response) == 1 else tuple(response)
    return " ".join(str(response).split()) if isinstance(response, str) else response


def outcomes(
    records: Iterable[dict[str, Any]], metric: str | None = None, filter_name: str | None = None
) -> dict[Hashable, Outcome]:
    """Per-question outcomes from lm-eval sample records; `metric` and `filter_name` pick among several."""
    records = list(records)
    if not records:
        raise InputError("no sample records")
    filters = sorted({record.get("filter", "none") for record in records})
    if filter_name is None:
        if len(filters) > 1:
            raise InputError(
                f"the samples carry several filters {filters}; choose one with {option_name('filter_name', '--filter')}"
            )
        filter_name = filters[0]
    elif filter_name not in filters:
        raise InputError(f"filter {filter_name!r} not in the samples; they carry {filters}")
    chosen = [record for record in records if record.get("filter", "none") == filter_name]
    for record in chosen:
        absent = [key for key in ("doc_id", "filtered_resps") if key not in record]
        if absent:
            raise InputError(
                f"a sample record has no {absent}: not an lm-eval --log_samples record ({sorted(record)})"
            )
    if metric is None and not chosen[0].get("metrics"):
        raise InputError(f"doc_id {chosen[0]['doc_id']} lists no 'metrics'; choose one (metric / --metric)")
    metric = metric or chosen[0]["metrics"][0]
    hashes = [record.get("doc_hash") for record in chosen]
    unique_hashes = None not in hashes and len(set(hashes)) == len(hashes)
    result: dict[Hashable, Outcome] = {}
    for record in chosen:
        if metric not in record:
            raise MissingMetricError(
                f"doc_id {record['doc_id']} has no metric {metric!r}; it has {record.get('metrics')}"
            )
        key = record["doc_hash"] if unique_hashes else (record["doc_id"], record.get("doc_hash"))
        try:
            value = float(record[metric])
        except (TypeError, ValueError):
            raise InputError(
                f"doc_id {record['doc_id']}: metric {metric!r} is {record[metric]!r}, not a number"
            ) from None
        result[key] = Outcome(_answer(record), value >= 0.5)
    return result


def align(*runs: Mapping[Hashable, Outcome], names: Sequence[str] | None = None) -> list[Hashable]:
    """The questions every run answered, in the first run's order; raise when the runs' questions differ (naming
    the runs by `names`, e.g. their files, else by position)."""
    names = list(names) if names is not None else [f"run {position}" for position in range(len(runs))]
    keys = list(runs[0])
    for position, run in enumerate(runs[1:], start=1):
        missing, extra = set(keys) - set(run), set(run) - set(keys)
        if missing or extra:
            example = next(iter(missing or extra))
            raise InputError(
                f"{names[position]} does not cover the same questions as {names[0]} ({len(missing)} missing, "
                f"{len(extra)} extra; e.g. {example!r}): compare sample logs of the same task, data and limit"
            )
    return keys


def transitions(frozen: Mapping[Hashable, Outcome], adapted: Mapping[Hashable, Outcome]) -> dict[str, np.ndarray]:
    """Per-question 0/1 arrays for C, F, G, W and the frozen/adapted correctness, aligned by question."""
    keys = align(frozen, adapted)
    before = np.array([frozen[key].correct for key in keys])
    after = np.array([adapted[key].correct for key in keys])
    changed = np.array([frozen[key].answer != adapted[key].answer for key in keys])
    return {
        "C": changed,
        "F": before & ~after,
        "G": ~before & after,
        "W": ~before & ~after & changed,
        "frozen_correct": before,
        "adapted_correct": after,
    }


def churn_counts(frozen: Mapping[Hashable, Outcome], adapted: Mapping[Hashable, Outcome]) -> dict[str, int]:
    per_question = transitions(frozen, adapted)
    counts = {kind: int(per_question[kind].sum()) for kind in KINDS}
    counts.update(
        n=len(per_question["C"]),
        frozen_correct=int(per_question["frozen_correct"].sum()),
        adapted_correct=int(per_question["adapted_correct"].sum()),
    )
    return counts


def _rate(kind: str):
    # C per question; F per frozen-correct question; G and W per frozen-wrong question (NaN without opportunities)
    def statistic(events: np.ndarray, frozen_correct: np.ndarray) -> float:
        opportunities = {"C": np.ones_like(frozen_correct), "F": frozen_correct}.get(kind, 1.0 - frozen_correct)
        total = opportunities.sum()
        return float(events.sum() / total) if total > 0 else float("nan")

    return statistic


def churn_report(
    frozen: Mapping[Hashable, Outcome],
    adapted: Mapping[Hashable, Outcome],
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Counts, rates with paired-question bootstrap intervals, and both accuracies."""
    per_question = transitions(frozen, adapted)
    report: dict[str, Any] = churn_counts(frozen, adapted)
    frozen_correct = per_question["frozen_correct"].astype(float)
    for kind in KINDS:
        interval = bootstrap_interval(
            _rate(kind),
            per_question[kind].astype(float),
            frozen_correct,
            n_resamples=n_resamples,
            confidence=confidence,
            seed=seed,
        )
        report[f"{kind}_rate"] = interval.as_dict()
    report["frozen_accuracy"] = float(per_question["frozen_correct"].mean())
    report["adapted_accuracy"] = float(per_question["adapted_correct"].mean())
    return report


def compare_churn(
    frozen: Mapping[Hashable, Outcome],
    method: Mapping[Hashable, Outcome],
    comparator: Mapping[Hashable, Outcome],
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Reduction 1 − count(method)/count(comparator) for C, F, G, F+G and W, paired over questions.

    Both adapted runs are compared with the same frozen run; the bootstrap resamples questions jointly, so the
    interval reflects which questions happened to be asked (the paper's Table 20 protocol).
    """
    align(frozen, method, comparator)
    ours, theirs = transitions(frozen, method), transitions(frozen, comparator)
    ours["F+G"], theirs["F+G"] = ours["F"] | ours["G"], theirs["F"] | theirs["G"]

    def reduction(a: np.ndarray, b: np.ndarray) -> float:
        return float(1.0 - a.sum() / b.sum()) if b.sum() > 0 else float("nan")

    report: dict[str, Any] = {}
    for kind in (*KINDS, "F+G"):
        interval = bootstrap_interval(
            reduction,
            ours[kind].astype(float),
            theirs[kind].astype(float),
            n_resamples=n_resamples,
            confidence=confidence,
            seed=seed,
        )
        report[kind] = {"method": int(ours[kind].sum()), "comparator": int(theirs[kind].sum()), **interval.as_dict()}
    report["accuracy_difference"] = float(ours["adapted_correct"].mean() - theirs["adapted_correct"].mean())
    report["n"] = len(ours["C"])
    return report


def flat_metrics(report: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """Scalar view of a `churn_report` for trainer logs: counts and the rates' point estimates."""
    flat = {f"{prefix}/{kind}": float(report[kind]) for kind in KINDS}
    flat.update({f"{prefix}/{kind}_rate": report[f"{kind}_rate"]["estimate"] for kind in KINDS})
    return flat
