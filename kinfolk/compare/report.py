"""The comparison's report folder, written whole or not at all (`kinfolk.atomic`):

- `report.md`: the mode (planned or exploratory) and the answer first — `compare.png`, the verdict lines (in
  `kinfolk.verdict_words`' words), how much of the baseline's gain each method reaches, the answer churn at each verdict level beside the drift, and a warning
  for each chosen rate at its grid's end — then each method's drift and churn at the matched levels, the rate
  choice (`curves.png` and every rate's drift at the selection level), each retained source's drift at every
  level (with several sources) and, when the verdicts read validation, the caveat of choosing on the curves they
  read;
- `report.json`: the same numbers (`Analysis`, the churn), with every run's folder;
- `compare.png`, `curves.png` and their axis limits in `figures.json` (`kinfolk.compare.figures`);
- `drift-<method>/`: for every method but the baseline, `kinfolk drift`'s matched-gain report of the chosen runs
  (that method against each other one) at the report levels, the ones every chosen run reaches, on the drift the
  verdicts read (`Analysis.judged_runs`: the test split's where there is one).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from kinfolk.atomic import atomic_directory
from kinfolk.compare.analysis import Analysis
from kinfolk.compare.answers import LevelChurn, level_churn
from kinfolk.compare.figures import COMPARE_FIGURE, CURVES_FIGURE, write_figures
from kinfolk.drift import target_matched
from kinfolk.drift import write_report as write_drift_report
from kinfolk.drift.levels import GainLevel, seeds_drift
from kinfolk.verdict_words import NOT_REACHED, WORDS

CAVEAT = (
    "Each method's rate is chosen on the same validation curves the verdicts read: with several rates per method "
    "that flatters every method by its best-of-k. For a confirmatory comparison give --test_split (the verdicts then "
    "read test) and --plan."
)


def write_report(analysis: Analysis, out: str | Path, about: Sequence[str], target: str) -> str:
    """The report folder `out` (replaced whole); `about` says the mode (its first line, report.md's first) and the
    set-up, `target` names the target metric. Returns report.md's text."""
    matched_reports = drift_reports(analysis, target)
    text = report_markdown(analysis, about, list(matched_reports))
    with atomic_directory(out, overwrite=True) as staging:
        (staging / "report.md").write_text(text, encoding="utf-8")
        (staging / "report.json").write_text(json.dumps(report_json(analysis, about, target), indent=2))
        write_figures(analysis, staging, target)
        for method, matched in matched_reports.items():
            write_drift_report(matched, staging / f"drift-{method}")
    return text


def drift_reports(analysis: Analysis, target: str) -> dict:
    """`kinfolk.drift.target_matched` of the chosen runs for every method but the baseline, at the report levels
    every chosen run reaches (none when there is no such level)."""
    chosen = analysis.judged_runs()
    levels = sorted({verdict.level for verdict in analysis.verdicts if verdict.outcome != NOT_REACHED})
    reached = [level for level in levels if all(run.drift_at(level).drift is not None for run in chosen)]
    if not reached:
        return {}
    methods = [choice.method for choice in analysis.choices if choice.method != analysis.baseline]
    return {method: target_matched(chosen, method, reached, target=target) for method in methods}


def churn_at_levels(analysis: Analysis) -> list[LevelChurn]:
    """Every method's answer churn at every verdict level (`kinfolk.compare.answers`), levels in order."""
    chosen = analysis.chosen_runs()
    return [
        level_churn(choice.method, [run for run in chosen if run.method == choice.method], level.value)
        for level in analysis.levels
        for choice in analysis.choices
    ]


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
        "verdicts": [asdict(verdict) for verdict in analysis.verdicts],
        "verdict_split": analysis.split,
        "planned": analysis.planned,
        "sources": [asdict(row) for row in analysis.sources],
        "reached": analysis.reached,
        "edge_warnings": analysis.edge_warnings,
        "churn": [asdict(churn) for churn in churn_at_levels(analysis)],
        "runs": [
            {**asdict(key), "path": run.path, "checkpoints": sorted(run.checkpoints)}
            for key, run in analysis.runs.items()
        ],
        "caveat": CAVEAT if analysis.split == "validation" else None,
    }


def _count(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def churn_line(level: GainLevel, baseline: str, churns: Sequence[LevelChurn]) -> str:
    """One level's churn in a sentence: "at 50% of lora's gain (target ...), 2 of 64 retained answers changed with
    atlas (step 15 of each seed), 11 with lora (...)"."""
    said = []
    for churn in churns:
        steps = ", ".join("-" if step is None else str(step) for step in churn.steps)
        where = f"at step{'s' * (len(churn.steps) > 1)} {steps}"
        if churn.changed is None:
            said.append(f"not measured with {churn.method} ({where}: not reached, or no answers kept)")
        elif not said or said[0].startswith("not measured"):
            said.append(f"{_count(churn.changed)} of {churn.prompts} retained answers changed with {churn.method} "
                        f"({where})")  # fmt: skip
        else:
            said.append(f"{_count(churn.changed)} with {churn.method} ({where})")
    return f"at {level.fraction:.0%} of {baseline}'s gain (target {level.value:.4g}): {', '.join(said)}"


def report_markdown(analysis: Analysis, about: Sequence[str], matched: Sequence[str]) -> str:
    """report.md; `matched` names the methods with a `drift-<method>/` report."""
    methods = [choice.method for choice in analysis.choices]
    baseline = analysis.baseline
    churns = churn_at_levels(analysis)
    mode, *setup = about  # the mode (planned or exploratory) heads the report; the rest is the set-up
    lines = [f"# kinfolk compare: {', '.join(methods)} against {baseline}", "", mode, "", "## The answer", ""]
    lines += [
        f"![every method's retained KL against the target]({COMPARE_FIGURE})",
        "",
        f"`{COMPARE_FIGURE}`: retained KL (log) against the target at each method's chosen rate, on one pair of "
        f"axes; dashed verticals: the verdict levels, as shares of {baseline}'s gain; dotted, in each method's "
        f"colour: the share of {baseline}'s gain it reaches.",
        "",
        f"Verdicts ({', '.join(WORDS)}: docs/compare.md):",
        "",
        *(f"- {verdict.line}" for verdict in analysis.verdicts),
        "",
        f"How much of {baseline}'s gain each method reaches (the highest level every seed of its chosen rate "
        "reaches):",
        "",
    ]
    for method, reached in analysis.reached.items():
        lines.append(f"- {method}: {'no gain to share' if reached is None else f'{reached:.0%}'}")
    lines.append("")
    if any(churn.prompts for churn in churns):
        lines += ["Answer churn at the verdict levels (greedy answers of a fixed set of retained prompts, read at "
                  "each run's checkpoint nearest the level, against its step 0; mean over seeds):", ""]  # fmt: skip
        for index, level in enumerate(analysis.levels):
            lines.append(f"- {churn_line(level, baseline, churns[index * len(methods) : (index + 1) * len(methods)])}")
        lines.append("")
    if analysis.edge_warnings:
        lines += ["Warnings:", "", *(f"- {warning}" for warning in analysis.edge_warnings), ""]
    lines += ["## Set-up", "", *setup, ""]
    lines += matched_table(analysis, churns)
    lines += [
        "## Learning rates, chosen on validation",
        "",
        f"![each method's runs at every rate]({CURVES_FIGURE})",
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
    lines.append("")
    if matched:
        reports = ", ".join(f"`drift-{method}/report.md`" for method in matched)
        where = (
            "drift on the validation rows"
            if analysis.split == "validation"
            else ("levels found on the validation target, drift read on the test rows, as the verdicts read it")
        )
        lines += [
            f"Matched-gain reports of the chosen runs, at the levels every one reaches ({where}): {reports}.",
            "",
        ]
    else:
        lines += ["No matched-gain report: no verdict level is reached by every chosen run.", ""]
    lines += source_table(analysis)
    if analysis.split == "validation":
        lines += [f"Caveat: {CAVEAT}", ""]
    return "\n".join(lines)


def matched_table(analysis: Analysis, churns: Sequence[LevelChurn]) -> list[str]:
    """Each method's drift (geometric mean over seeds) and churn at every verdict level: matched targets, never
    its final point, which sits at another target for each method."""
    chosen = analysis.chosen_runs()
    heads = [f"{level.fraction:.0%} (target {level.value:.4g})" for level in analysis.levels]
    read = "" if analysis.split == "validation" else "; both read on validation, the verdicts on test"
    lines = [f"## Drift and churn at the matched levels (means over seeds{read})", ""]
    lines.append(
        "| method | rate | seeds | reaches | " + " | ".join(f"drift at {h} | churn at {h}" for h in heads) + " |"
    )
    lines.append("|---|---|---|---|" + "---|---|" * len(heads))
    by_key = {(churn.method, churn.level): churn for churn in churns}
    for choice in analysis.choices:
        runs = [run for run in chosen if run.method == choice.method]
        reached = analysis.reached.get(choice.method)
        cells = [choice.method, f"{choice.rate:g}", str(len(runs)), "-" if reached is None else f"{reached:.0%}"]
        for level in analysis.levels:
            drift = seeds_drift(runs, level.value)
            churn = by_key[choice.method, level.value]
            cells.append(NOT_REACHED if drift is None else f"{drift:.4g}")
            cells.append("-" if churn.changed is None else f"{_count(churn.changed)} of {churn.prompts}")
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def source_table(analysis: Analysis) -> list[str]:
    """report.md's rows per retained source (with more than one): each method's drift on each at every level."""
    forgetting = any(row.forgetting is not None for row in analysis.sources)
    if len({row.source for row in analysis.sources}) < 2 and not forgetting:
        return []
    levels = " | ".join(f"{level.fraction:.0%} ({level.value:.4g})" for level in analysis.levels)
    lines = [f"## Drift per retained source ({analysis.split}; geometric mean over the chosen seeds)", ""]
    if forgetting:
        lines += ["Each cell: KL, then PEFT's forgetting figure (the source's NLL per token there minus at step 0, "
                  "mean over the seeds; positive: worse at the retained text).", ""]  # fmt: skip
    lines += [f"| method | source | {levels} |", "|---|---|" + "---|" * len(analysis.levels)]
    for row in analysis.sources:
        cells = " | ".join(_source_cell(row, index) for index in range(len(analysis.levels)))
        lines.append(f"| {row.method} | {row.source} | {cells} |")
    return [*lines, ""]


def _source_cell(row, index: int) -> str:
    drift = row.drifts[index]
    if drift is None:
        return "not reached"
    if row.forgetting is None or row.forgetting[index] is None:
        return f"{drift:.4g}"
    return f"{drift:.4g}; forgetting {row.forgetting[index]:+.3g}"
