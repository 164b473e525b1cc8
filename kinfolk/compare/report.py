"""The comparison's report folder, written whole or not at all (`kinfolk.atomic`):

- `report.md`: the mode (planned or exploratory) and set-up, the verdict lines, each method's rate choice (every
  rate's drift at the selection level), the chosen points, each retained source's drift at every level (with
  several sources) and, when the verdicts read validation, the caveat of choosing on the curves they read;
- `report.json`: the same numbers (`Analysis`), with every run's folder;
- `curves.png`: per method, the target against the step and the retained KL against the target, every rate's runs
  (the chosen rate drawn bold, the selection level dashed);
- `drift-<method>/`: for every method but the baseline, `kinfolk drift`'s matched-gain report of the chosen runs
  (that method against each other one) at the report levels, the ones every chosen run reaches.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from kinfolk.atomic import atomic_directory
from kinfolk.compare.analysis import Analysis
from kinfolk.compare.verdicts import NOT_REACHED
from kinfolk.drift import target_matched
from kinfolk.drift import write_report as write_drift_report
from kinfolk.drift.matching import START_STEP

CAVEAT = (
    "Each method's rate is chosen on the same validation curves the verdicts read: with several rates per method "
    "that flatters every method by its best-of-k. For a confirmatory comparison give --test_split (the verdicts then "
    "read test) and --plan."
)


def write_report(analysis: Analysis, out: str | Path, about: Sequence[str], target: str) -> str:
    """The report folder `out` (replaced whole); `about` describes the set-up in report.md's first lines, `target`
    names the target metric. Returns report.md's text."""
    matched_reports = drift_reports(analysis, target)
    text = report_markdown(analysis, about, list(matched_reports))
    with atomic_directory(out, overwrite=True) as staging:
        (staging / "report.md").write_text(text, encoding="utf-8")
        (staging / "report.json").write_text(json.dumps(report_json(analysis, about, target), indent=2))
        plot_curves(analysis, staging / "curves.png")
        for method, matched in matched_reports.items():
            write_drift_report(matched, staging / f"drift-{method}")
    return text


def drift_reports(analysis: Analysis, target: str) -> dict:
    """`kinfolk.drift.target_matched` of the chosen runs for every method but the baseline, at the report levels
    every chosen run reaches (none when there is no such level)."""
    chosen = analysis.chosen_runs()
    levels = sorted({verdict.level for verdict in analysis.verdicts if verdict.outcome != NOT_REACHED})
    reached = [level for level in levels if all(run.drift_at(level).drift is not None for run in chosen)]
    if not reached:
        return {}
    methods = [choice.method for choice in analysis.choices if choice.method != analysis.baseline]
    return {method: target_matched(chosen, method, reached, target=target) for method in methods}


def report_json(analysis: Analysis, about: Sequence[str], target: str) -> dict:
    return {
        "about": list(about),
        "target": target,
        "baseline": analysis.baseline,
        "selection": {
            "rule": analysis.rule,
            "fraction": analysis.selection_fraction,
            "level": analysis.selection_level,
            "choices": [asdict(choice) for choice in analysis.choices],
        },
        "fractions": analysis.fractions,
        "levels": [asdict(level) for level in analysis.levels],
        "verdict_split": analysis.split,
        "planned": analysis.planned,
        "sources": [asdict(row) for row in analysis.sources],
        "verdicts": [asdict(verdict) for verdict in analysis.verdicts],
        "runs": [
            {**asdict(key), "path": run.path, "checkpoints": sorted(run.checkpoints)}
            for key, run in analysis.runs.items()
        ],
        "caveat": CAVEAT if analysis.split == "validation" else None,
    }


def report_markdown(analysis: Analysis, about: Sequence[str], matched: Sequence[str]) -> str:
    """report.md; `matched` names the methods with a `drift-<method>/` report."""
    methods = [choice.method for choice in analysis.choices]
    lines = [f"# kinfolk compare: {', '.join(methods)} against {analysis.baseline}", "", *about, ""]
    lines += ["## Verdicts", "", *(f"- {verdict.line}" for verdict in analysis.verdicts), ""]
    lines += [
        "## Learning rates, chosen on validation",
        "",
        f"Selection level: target {analysis.selection.describe()}; the verdicts' levels: "
        f"{'; '.join(level.describe() for level in analysis.levels)}. Rule: {analysis.rule}.",
        "",
        "| method | rate | drift at the selection level | mean best score | chosen |",
        "|---|---|---|---|---|",
    ]
    for choice in analysis.choices:
        for rate, drift in choice.drift_by_rate.items():
            chosen = f"yes ({choice.how})" if rate == f"{choice.rate:g}" else ""
            shown = "not reached by every seed" if drift is None else f"{drift:.4g}"
            lines.append(f"| {choice.method} | {rate} | {shown} | {choice.best_by_rate[rate]:.4g} | {chosen} |")
    lines += ["", "## Chosen points (means over seeds)", ""]
    lines.append("| method | rate | seeds | start | final target | final retained KL |")
    lines.append("|---|---|---|---|---|---|")
    for choice in analysis.choices:
        runs = [
            run
            for key, run in analysis.runs.items()
            if (key.method, key.learning_rate) == (choice.method, choice.rate)
        ]
        ends = [sorted(run.checkpoints) for run in runs]
        start, final = (np.mean([points[i][1] for points in ends]) for i in (0, -1))
        kl = np.mean([points[-1][2] for points in ends])
        lines.append(f"| {choice.method} | {choice.rate:g} | {len(runs)} | {start:.4g} | {final:.4g} | {kl:.4g} |")
    lines.append("")
    if matched:
        reports = ", ".join(f"`drift-{method}/report.md`" for method in matched)
        lines += [f"Matched-gain reports of the chosen runs, at the levels every one reaches: {reports}.", ""]
    else:
        lines += ["No matched-gain report: no verdict level is reached by every chosen run.", ""]
    lines += source_table(analysis)
    if analysis.split == "validation":
        lines += [f"Caveat: {CAVEAT}", ""]
    return "\n".join(lines)


def source_table(analysis: Analysis) -> list[str]:
    """report.md's rows per retained source (with more than one): each method's drift on each at every level."""
    if len({row.source for row in analysis.sources}) < 2:
        return []
    levels = " | ".join(f"{level.fraction:.0%} ({level.value:.4g})" for level in analysis.levels)
    lines = [f"## Drift per retained source ({analysis.split}; geometric mean over the chosen seeds)", ""]
    lines += [f"| method | source | {levels} |", "|---|---|" + "---|" * len(analysis.levels)]
    for row in analysis.sources:
        cells = " | ".join("not reached" if drift is None else f"{drift:.4g}" for drift in row.drifts)
        lines.append(f"| {row.method} | {row.source} | {cells} |")
    return [*lines, ""]


def plot_curves(analysis: Analysis, path: Path) -> None:
    """Per method: target against step (top) and retained KL against target (bottom), a colour per rate."""
    import matplotlib  # a core dependency, imported here to keep it off the start-up path

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, len(analysis.choices), figsize=(4 * len(analysis.choices), 7), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for column, choice in enumerate(analysis.choices):
        top, bottom = axes[0][column], axes[1][column]
        rates = list(choice.drift_by_rate)
        for key, run in analysis.runs.items():
            if key.method != choice.method:
                continue
            chosen = key.learning_rate == choice.rate
            style = {"color": colours[rates.index(key.rate) % len(colours)], "linewidth": 2 if chosen else 0.8}
            points = sorted(run.checkpoints)
            first = key.seed == min(k.seed for k in analysis.runs if k.method == key.method)
            top.plot(
                [p[0] for p in points], [p[1] for p in points], label=f"lr {key.rate}" if first else None, **style
            )
            # the envelope after the untouched start, whose drift is 0 or float noise (no log scale for either)
            envelope = [(t, d) for step, t, d in run.envelope() if step != START_STEP and d > 0]
            if envelope:
                bottom.plot(*zip(*envelope), marker="o", markersize=2, **style)
        bottom.axvline(analysis.selection_level, linestyle="--", color="grey", linewidth=0.8)
        bottom.set_yscale("log")
        top.set_title(f"{choice.method} (chosen lr {choice.rate:g})")
        top.set_xlabel("step")
        top.set_ylabel("target score")
        bottom.set_xlabel("target score")
        bottom.set_ylabel("retained KL")
        top.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
