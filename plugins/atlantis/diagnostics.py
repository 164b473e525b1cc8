"""What a weighting scheme does to the data: ESS, quantiles, length bias, the extreme rows, and agreement with
another scheme.

Importance weights fail quietly: a handful of rows can carry the whole loss (low ESS/N), or the weights can
mostly encode response length (|Spearman(weight, length)| near 1), or a formula can rank nonsense answers high.
`weight_report` measures the first two, plus the quantiles and the fraction of rows up-weighted (w > 1), and lists
the `EXTREME_ROWS` highest- and lowest-weighted rows with each model's score and the start of the response, to be
read; `compare_weights` gives the paper's cross-architecture measure, the fraction of rows two schemes put on
opposite sides of 1.0 (46.78% for Qwen2 vs Gemma2), and their rank correlation.

>>> compare_weights([0.5, 1.5, 2.0, 0.9], [0.7, 0.8, 3.0, 1.2])
{'n': 4, 'sign_disagreement': 0.5, 'spearman': 0.8}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset

from kinfolk.atomic import write_json
from kinfolk.figures import pyplot, save_figure
from kinfolk.plugins.atlantis.config import (
    FORMULAS,
    RESPONSE_BYTES_COLUMN,
    ROLES,
    WeightConfig,
    logprob_column,
    resolve_config,
    tokens_column,
)
from kinfolk.plugins.atlantis.weights import (
    column_array,
    normalized_log_prob,
    required_columns,
    weights_from_scores,
)
from kinfolk.stats import effective_sample_size, quantiles, spearman
from kinfolk.tokens import DatasetFormatError, response_text

REPORT_NAME = "weights_report.json"
HISTOGRAM_NAME = "weights_hist.png"
EXTREME_ROWS = 5  # rows listed at each end of the weights
RESPONSE_PREVIEW = 80  # characters of a listed row's response


@dataclass(frozen=True)
class WeightedRow:
    """One scored row as the report lists it: its index in the scored data, its weight, each model's log-prob as
    the formula reads it (per byte, per token or per sequence, by the normalisation; every model scored, not only
    the formula's), and the start of its response (None when the data holds no response column)."""

    row: int
    weight: float
    log_probs: dict[str, float]
    response: str | None


def extreme_rows(
    scored: Dataset,
    weights: np.ndarray,
    rows: np.ndarray,
    config: WeightConfig,
    count: int = EXTREME_ROWS,
    text_field: str = "text",
) -> tuple[list[WeightedRow], list[WeightedRow]]:
    """The `count` highest- and the `count` lowest-weighted of `rows` (ties: the earlier row first); `text_field`
    holds the response of plain-text data, as `dataset_text_field` in SFTConfig."""
    highest = rows[np.argsort(-weights[rows], kind="stable")]
    lowest = rows[np.argsort(weights[rows], kind="stable")]
    terms = {}
    for role in ROLES:
        length = {"token": tokens_column(role), "byte": RESPONSE_BYTES_COLUMN}.get(config.normalization)
        if {logprob_column(role), length or logprob_column(role)} <= set(scored.column_names):
            lengths = None if length is None else column_array(scored, length)
            terms[role] = normalized_log_prob(
                column_array(scored, logprob_column(role)), lengths, config.normalization
            )

    def listed(index: int) -> WeightedRow:
        try:
            response = response_text(scored[int(index)], text_field)
        except DatasetFormatError:
            response = None
        if response is not None and len(response) > RESPONSE_PREVIEW:
            response = response[: RESPONSE_PREVIEW - 1] + "…"
        scores = {role: float(values[index]) for role, values in terms.items()}
        return WeightedRow(int(index), float(weights[index]), scores, response)

    return [listed(i) for i in highest[:count]], [listed(i) for i in lowest[:count]]


def summarize_weights(weights: np.ndarray, lengths: np.ndarray | None = None) -> dict[str, Any]:
    w = np.asarray(weights, dtype=np.float64)
    ess = effective_sample_size(w)
    return {
        "n": int(w.size),
        "ess": ess,
        "ess_over_n": ess / w.size if w.size else float("nan"),
        "mean": float(w.mean()),
        "min": float(w.min()),
        "max": float(w.max()),
        "quantiles": quantiles(w),
        "fraction_above_1": float(np.mean(w > 1.0)),
        "spearman_weight_length": None if lengths is None else spearman(w, lengths),
    }


def compare_weights(weights_a, weights_b, threshold: float = 1.0) -> dict[str, Any]:
    """Fraction of rows on opposite sides of `threshold` (up- vs down-weighted) and Spearman rank correlation."""
    a = np.asarray(weights_a, dtype=np.float64)
    b = np.asarray(weights_b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"compare_weights needs weights of the same rows, got {a.shape} and {b.shape}")
    return {
        "n": int(a.size),
        "sign_disagreement": float(np.mean((a > threshold) != (b > threshold))),
        "spearman": spearman(a, b),
    }


def weight_report(
    scored: Dataset, config: WeightConfig | None = None, text_field: str = "text", **options
) -> dict[str, Any]:
    """Diagnostics of the weights `config` gives `scored`, over its scored rows, and versus the other formulas;
    `highest_weighted` and `lowest_weighted` list the extreme rows (`WeightedRow`s as dicts)."""
    config = resolve_config(WeightConfig, config, options)
    result = weights_from_scores(scored, config)
    lengths = None
    if RESPONSE_BYTES_COLUMN in scored.column_names:
        lengths = np.asarray(scored[RESPONSE_BYTES_COLUMN])[result.scored]
    report: dict[str, Any] = {
        "config": dataclasses.asdict(config),
        "rows": len(scored),
        "skipped": int((~result.scored).sum()),
        "clipped": result.n_clipped,
        "pareto_k": result.pareto_k,
        **summarize_weights(result.weights[result.scored], lengths),
        "length_unit": "response UTF-8 bytes",
    }
    highest, lowest = extreme_rows(
        scored, result.weights, np.flatnonzero(result.scored), config, text_field=text_field
    )
    report["highest_weighted"] = [dataclasses.asdict(row) for row in highest]
    report["lowest_weighted"] = [dataclasses.asdict(row) for row in lowest]
    versus = {}
    for formula in FORMULAS:
        other = dataclasses.replace(config, formula=formula)
        if formula != config.formula and set(required_columns(other)) <= set(scored.column_names):
            other_result = weights_from_scores(scored, other)
            both = result.scored & other_result.scored
            versus[formula] = compare_weights(result.weights[both], other_result.weights[both])
    report["versus_other_formulas"] = versus
    return report


def format_report(report: dict[str, Any]) -> str:
    """The report as an aligned two-column table."""
    config = report["config"]
    lines = [
        (
            "scheme",
            f"{config['formula']}, per {config['normalization']}, T={config['temperature']:g}, "
            f"clip={config['clip']}, pareto={config['pareto_smoothing']}",
        ),
        ("rows (scored / skipped)", f"{report['n']} / {report['skipped']}"),
        ("ESS / N", f"{report['ess_over_n']:.4f}  (ESS {report['ess']:.1f})"),
        ("mean, min, max", f"{report['mean']:.4g}, {report['min']:.4g}, {report['max']:.4g}"),
        *((name, f"{value:.4g}") for name, value in report["quantiles"].items()),
        ("fraction w > 1", f"{report['fraction_above_1']:.4f}"),
        ("Spearman(w, length)", _number(report["spearman_weight_length"])),
        ("clipped rows", str(report["clipped"])),
    ]
    if report["pareto_k"] is not None:
        lines.append(("Pareto k", _number(report["pareto_k"])))
    for formula, comparison in report["versus_other_formulas"].items():
        lines.append(
            (
                f"vs {formula}",
                f"sign disagreement {comparison['sign_disagreement']:.4f}, Spearman {_number(comparison['spearman'])}",
            )
        )
    width = max(len(name) for name, _ in lines)
    text = [f"{name:<{width}}  {value}" for name, value in lines]
    unit = {"byte": "per byte", "token": "per token", "none": "per sequence"}[config["normalization"]]
    for title, key in (("highest", "highest_weighted"), ("lowest", "lowest_weighted")):
        text += ["", f"{title} weights (row, weight, log-prob {unit} of each model scored, response):"]
        text += [_row_line(row) for row in report.get(key, [])]
    return "\n".join(text)


def _row_line(row: dict[str, Any]) -> str:
    scores = "  ".join(f"{role} {value:+.4g}" for role, value in row["log_probs"].items())
    response = "" if row["response"] is None else f"  {row['response']!r}"
    return f"  {row['row']:>6}  {row['weight']:8.4g}  {scores}{response}"


def _number(value: float | None) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value:.4f}"


def write_report(
    report: dict[str, Any], directory: str | Path, weights: np.ndarray | None = None, prefix: str = ""
) -> list[Path]:
    """Write `<prefix>weights_report.json` and, when `weights` are given, a histogram PNG."""
    directory = Path(directory)
    written = [write_json(directory / f"{prefix}{REPORT_NAME}", _jsonable(report))]
    if weights is not None:
        figure, axes = pyplot().subplots(figsize=(6, 4))
        axes.hist(np.asarray(weights), bins=60, color="tab:blue")
        axes.axvline(1.0, color="black", linestyle="--", linewidth=1)
        axes.set_xlabel("weight")
        axes.set_ylabel("rows")
        axes.set_title(f"ATLANTIS weights (ESS/N {report['ess_over_n']:.3f})")
        written.append(save_figure(figure, directory / f"{prefix}{HISTOGRAM_NAME}"))
    return written


def _jsonable(value: Any) -> Any:
    """Plain JSON: NumPy scalars as numbers, NaN and infinities as null (strict JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value
