"""The matched-gain report on disk: `report.md`, `report.json` (`MatchedGain.as_dict()`) and `drift.png`."""

from __future__ import annotations

import json
from pathlib import Path

from kinfolk.atomic import atomic_directory
from kinfolk.drift.matching import MIN_INTERVAL_UNITS, START_STEP, Comparison, MatchedGain
from kinfolk.figures import pyplot, save_figure
from kinfolk.verdict_words import SHOWN, judged, not_tested


def _ratio_cell(comparison: Comparison) -> str:
    if comparison.ratio is None:
        return comparison.note
    seeds = len(comparison.seeds)
    if comparison.interval is not None:
        interval, check = comparison.interval, comparison.bootstrap
        word = judged((interval.low, interval.high), seeds)
        said = f"{'less' if comparison.ratio < 1 else 'more'} drift {SHOWN}" if word == SHOWN else word
        return (
            f"{said}: {comparison.ratio:.4f} [95% t-interval {interval.low:.4f}, {interval.high:.4f}; "
            f"bootstrap {check.low:.4f}, {check.high:.4f}]"
        )
    values = ", ".join(f"{value:.4f}" for value in comparison.ratio_by_seed.values())
    return f"{not_tested(seeds)}: {comparison.ratio:.4f} (per seed: {values})"


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def markdown(report: MatchedGain) -> str:
    method, requirements = report.method, report.requirements
    lines = [
        f"# `{report.kl}` at matched target scores",
        "",
        f"Target `{report.target}`, {len(requirements)} levels from {requirements[0]:g} to {requirements[-1]:g}. "
        f"How: {report.interpolation}. A run's mean drift averages its levels; ratios are {method}/comparator per "
        f"seed (paired by seed), geometric mean over seeds, with the 95% t-interval of the log ratios over seeds "
        f"(exponentiated) and a bootstrap cross-check from {MIN_INTERVAL_UNITS} seeds on; with fewer, the per-seed "
        f"ratios. Below 1 favours {method}. Verdicts (docs/compare.md): shown, not shown (the interval holds 1), not "
        f"tested (fewer than {MIN_INTERVAL_UNITS} seeds: no interval, the ratio is a measurement), not reached.",
        "",
        f"| method | seeds | mean drift | {method}/method | reduction |",
        "|---|---|---|---|---|",
    ]
    comparisons = {comparison.comparator: comparison for comparison in report.comparisons}
    for summary in report.methods:
        comparison = comparisons.get(summary.method)
        ratio_cell = "—" if comparison is None else _ratio_cell(comparison)
        reduction = "—" if comparison is None or comparison.ratio is None else f"{100 * (1 - comparison.ratio):.2f}%"
        lines.append(
            f"| {summary.method} | {len(summary.seeds)} | {summary.mean_drift:.4g} | {ratio_cell} | {reduction} |"
        )
    names = [summary.method for summary in report.methods]
    lines += ["", "## Drift per level (geometric mean over seeds)", ""]
    lines += ["| level | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for i, level in enumerate(requirements):
        cells = " | ".join(_number(summary.drift_by_requirement[i]) for summary in report.methods)
        lines.append(f"| {level:g} | {cells} |")
    if report.unreached:
        lines += ["", "## Levels not reached (left out: a run would reach them only by extrapolation)", ""]
        for entry in report.unreached:
            lines.append(f"- {entry.requirement:g}: " + "; ".join(f"{n} {why}" for n, why in entry.runs.items()))
    if report.flags:
        lines += ["", "## Flags", "", *(f"- {flag}" for flag in report.flags)]
    return "\n".join(lines) + "\n"


def plot(report: MatchedGain, path: Path) -> None:
    """Drift against target score: every checkpoint, each run's envelope, and each method's level curve."""
    plt = pyplot()

    figure, axis = plt.subplots(figsize=(7, 4.5))
    names = [summary.method for summary in report.methods]
    colours = dict(zip(names, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 10))
    for run in report.runs:
        # not the untouched start: its drift is 0 (no log), or float noise that would stretch the axis to 1e-17
        points = [(target, drift) for step, target, drift in run.checkpoints if step != START_STEP and drift > 0]
        if points:
            axis.scatter(*zip(*points), s=14, alpha=0.45, color=colours[run.method])
        envelope = [(target, drift) for step, target, drift in run.envelope if step != START_STEP and drift > 0]
        if len(envelope) > 1:  # straight on a log axis: the geometric interpolation itself
            axis.plot(*zip(*envelope), linewidth=0.8, alpha=0.45, color=colours[run.method])
    for summary in report.methods:
        points = [(k, d) for k, d in zip(report.requirements, summary.drift_by_requirement) if d]  # log axis
        if points:
            axis.plot(*zip(*points), marker="o", markersize=3, color=colours[summary.method], label=summary.method)
    axis.set_yscale("log")
    axis.set_xlabel(report.target)
    axis.set_ylabel(f"{report.kl} (lower is less drift)")
    axis.set_title("Drift on first reaching each target score")
    axis.legend()
    save_figure(figure, path, dpi=150)


def write_report(report: MatchedGain, out: str | Path, overwrite: bool = False) -> str:
    """`report.md`, `report.json` and `drift.png` in the folder `out`, atomically; returns the markdown."""
    text = markdown(report)
    with atomic_directory(out, overwrite=overwrite) as staging:
        (staging / "report.md").write_text(text, encoding="utf-8")
        (staging / "report.json").write_text(json.dumps(report.as_dict(), indent=2), encoding="utf-8")
        plot(report, staging / "drift.png")
    return text
