"""The demo's report: markdown tables from `results.json`, PNG plots (`kinfolk.figures`), a headline.

>>> print(markdown_table(["model", "add"], [["uniform", 0.5]]))
| model | add |
|---|---|
| uniform | 0.50 |
"""

from __future__ import annotations

import contextlib
import textwrap
from itertools import pairwise
from pathlib import Path
from typing import Any

from kinfolk.atomic import atomic_file
from kinfolk.drift.matching import INTERPOLATION, Run
from kinfolk.figures import pyplot, save_figure


def _cell(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def _final_kl(results: dict, method: str) -> float:
    trajectory = results["atlas"]["retained_kl"][method]
    return float(trajectory[-1][1]) if trajectory else float("nan")


def _roles(results: dict) -> tuple[str, str, str]:
    skills = results["skills"]
    return skills["retained"], skills["target"], skills["held_out"]


def atlantis_rows(results: dict) -> list[list[Any]]:
    """One row per training run of the demo's ATLANTIS cell: validation and test accuracy, ESS/N."""
    retained, target, _ = _roles(results)
    training = results["atlantis"]["run"]["cells"][results["atlantis"]["cell"]]["training"]
    rows = []
    for method, run in training.items():
        if run is None:
            continue
        label = f"{method} (T = {run['temperature']:g})" if "temperature" in run else method
        test = run["test"]
        rows.append(
            [label, run["validation"]["mean"], test[retained], test[target], test["mean"], run["ess_fraction"]]
        )
    return rows


def formula_rows(results: dict) -> list[list[Any]]:
    """Every cell's weights (the demo's formula and temperature, per byte) against the cell's estimand."""
    atlantis = results["atlantis"]
    key = f"{atlantis['settings']['formulas'][0]}/byte/{atlantis['settings']['temperatures'][0]:g}"
    rows = []
    for cell, entry in atlantis["run"]["cells"].items():
        d = entry["diagnostics"][key]
        rows.append(
            [
                cell,
                entry["rows"],
                d["spearman"],
                d["auc_good"],
                d["mass_good"],
                d["mass_off_format"],
                d["mass_wrong"],
                d["ess_fraction"],
                entry["transfer"]["spearman"],
            ]
        )
    return rows


def atlas_rows(results: dict) -> list[list[Any]]:
    retained, target, held_out = _roles(results)
    rows = []
    for name, per_skill in results["atlas"]["scores"].items():
        kl = _final_kl(results, name) if name in results["atlas"]["retained_kl"] else 0.0
        rows.append(
            [
                name,
                per_skill[target]["accuracy"],
                per_skill[retained]["accuracy"],
                per_skill[retained]["answer_accuracy"],
                per_skill[held_out]["answer_accuracy"],
                kl,
            ]
        )
    return rows


DRAWN_RISE = 0.5  # a run's rise is drawn when no two neighbouring checkpoints span more than this share of it


def demo_runs(results: dict) -> dict[str, Run]:
    """The demo's ATLAS and LoRA runs as `kinfolk drift` reads runs: (step, test target score, retained KL)."""
    atlas = results["atlas"]
    runs = {}
    for method in ("atlas", "lora"):
        target_at = dict(map(tuple, atlas.get("target_curve", {}).get(method, [])))
        checkpoints = [(step, target_at[step], kl) for step, kl in atlas["retained_kl"][method] if step in target_at]
        runs[method] = Run(method, str(results["config"]["seed"]), f"models/{method}", checkpoints)
    return runs


def largest_rise_share(run: Run) -> float:
    """The largest change of the target score between neighbouring checkpoints, as a share of the run's whole
    range of scores: near 1 when the skill is learned between two measurements, so the rise is not drawn.

    >>> largest_rise_share(Run("lora", "0", "", [(0, 0.0, 0.0), (5, 0.1, 0.01), (10, 1.0, 0.1)]))
    0.9
    """
    targets = [target for _, target, _ in sorted(run.checkpoints)]
    whole = max(targets) - min(targets)
    return max(abs(b - a) for a, b in pairwise(targets)) / whole if whole > 0 else 0.0


def _steps_measured(runs: dict[str, Run]) -> str:
    """The measured steps of the runs, as a short range: '0, 1, 2 ... 600 (41)'."""
    steps = sorted({step for run in runs.values() for step, _, _ in run.checkpoints})
    shown = ", ".join(map(str, steps[:3])) + (f" ... {steps[-1]}" if len(steps) > 3 else "")
    return f"{shown} ({len(steps)})"


def target_matched_text(results: dict, short: bool = False) -> str:
    """ATLAS / LoRA retained KL at the ATLAS experiment's target levels (fractions of LoRA's gain over the frozen
    model's test score), each run's KL read off its own curve by `kinfolk drift`'s interpolation (so the verdict
    does not depend on when checkpoints were saved), with both KLs beside the ratio; or why there is none. Where LoRA
    does not rise above the frozen score there is no level and no ratio, and a level a run reaches only by
    extrapolation is reported as not reached. `short`: without the levels' definition and the measurement's
    resolution."""
    from kinfolk.lab.methods.atlas import GAIN_LEVELS

    analysis = results["atlas"].get("analysis", {})
    if "methods" not in analysis:
        return f"no matched comparison: {analysis.get('undefined', 'not measured')}"
    target = results["skills"]["target"]
    runs = demo_runs(results)
    parts = []
    for name in GAIN_LEVELS:
        level = analysis["levels"][name]
        atlas, lora = runs["atlas"].drift_at(level), runs["lora"].drift_at(level)
        if atlas.drift is None or lora.drift is None:
            missing = "ATLAS" if atlas.drift is None else "LoRA"
            parts.append(f"{missing} {(atlas if atlas.drift is None else lora).how} at {target} {level:.2f}")
        elif lora.drift <= 0:
            parts.append(f"LoRA's KL is 0 at {target} {level:.2f}")
        else:
            parts.append(
                f"{atlas.drift / lora.drift:.3f} at {target} {level:.2f} ({atlas.drift:.4f} vs {lora.drift:.4f})"
            )
    text = "retained KL(ATLAS) / KL(LoRA): " + ", ".join(parts)
    shares = {method: largest_rise_share(run) for method, run in runs.items()}
    undrawn = [method for method, share in shares.items() if share > DRAWN_RISE]
    if short:
        return text + ("; the rise is not drawn: too few checkpoints" if undrawn else "")
    fractions = " and ".join(f"{fraction:g}" for fraction in GAIN_LEVELS.values())
    resolution = (
        f"measured at steps {_steps_measured(runs)}; the largest change between neighbouring checkpoints is "
        + " and ".join(f"{share:.2f} ({method})" for method, share in shares.items())
        + " of each run's range"
    )
    warning = (
        f". Not drawn: {', '.join(undrawn)} learned {target} between two measurements, so the ratio is mostly "
        "the interpolation's; raise `--drift_points`"
        if undrawn
        else ""
    )
    return (
        f"{text} (levels at {fractions} of LoRA's gain from the frozen {analysis['frozen']:.2f} to its best "
        f"{analysis['lora_best']:.2f}; each run's KL read off its own curve at the level ({INTERPOLATION}), on test "
        f"scores: exploratory; one run each; {resolution}){warning}"
    )


ADAPT_SHOWN = ("distilled", "weight-delta", "cross-patch")  # the methods of the headline and the plot


def adapt_rows(results: dict) -> list[list[Any]]:
    """Per variant and method: test accuracy (the variant's format, retained + target) of every size k = 0..M, each
    in its validation-chosen patch order."""
    rows = []
    for variant, entry in results["adapt"]["transfer"].items():
        for method, curve in entry["curves"].items():
            rows.append([variant, method, *(size["test"]["mean"] for size in curve["chosen"])])
    return rows


def adapt_routing_text(results: dict) -> str:
    """Per routed family: how many of its routings (average policy, one per distinct assignment) lie above the
    random-mix hull of its fixed sizes on test, and the largest gain over it (one run: exploratory)."""
    parts = []
    for method, entry in results["adapt"]["routing"].items():
        gains = [p["gain_over_hull"] for p in entry["routed"]["average"] if p["gain_over_hull"] is not None]
        best = f", at most {max(gains):+.3f}" if gains else ""
        parts.append(f"{method}: {sum(g > 0 for g in gains)} of {len(gains)} routings above the random-mix hull{best}")
    return "; ".join(parts)


def lm_eval_rows(results: dict) -> list[list[Any]]:
    return [[name, *per_task.values()] for name, per_task in results["lm_eval"].items()]


HEADLINE_WIDTH = 100  # a terminal's columns: each method's block wraps to it


def evidence(question: str, baseline: str, mentioning: str = "", results_dir: Path | None = None) -> list[str]:
    """What the newest committed experiment of `question` (and the earlier primaries it carries) says about
    comparisons against `baseline` (those of its primaries naming `mentioning`, where some do): one line per primary
    (`evidence.EvidenceRow.line`), whose sentence says whether it survived Holm. Without the committed results (an
    installed package) it points to docs/results.md."""
    from kinfolk.lab.demo.evidence import RESULTS_DIR, evidence_rows

    directory = results_dir or RESULTS_DIR
    rows = evidence_rows(directory) if directory.is_dir() else []
    rows = [row for row in rows if row.question == question and row.baseline == baseline]
    if mentioning and any(mentioning in row.endpoint for row in rows):
        rows = [row for row in rows if mentioning in row.endpoint]
    return [row.line() for row in rows] or ["evidence over families: docs/results.md"]


def _block(method: str, compared: str, lines: list[str]) -> str:
    """One method's headline: its comparison on the first line, then each line wrapped to `HEADLINE_WIDTH`."""
    indent = " " * 4
    wrapped = [f"{method}  {compared}"]
    for line in lines:
        wrapped += textwrap.wrap(line, HEADLINE_WIDTH, initial_indent=indent, subsequent_indent=indent + "  ")
    return "\n".join(wrapped)


def headline_table(results: dict, results_dir: Path | None = None) -> str:
    """Per method: what this one run measured against its baseline, and what the committed experiment over
    families says about that comparison. Each method is a block of lines no wider than `HEADLINE_WIDTH`."""

    retained, target, _ = _roles(results)
    atlantis = results["atlantis"]
    training = atlantis["run"]["cells"][atlantis["cell"]]["training"]
    formula = atlantis["settings"]["formulas"][0]
    oracle = f", oracle {training['oracle']['test']['mean']:.2f}" if training["oracle"] else ""
    t = {row[0]: row for row in atlas_rows(results)}
    blocks = [
        _block(
            "ATLANTIS",
            f"uniform SFT -> {formula} weights (pool {atlantis['cell']}; 1 family)",
            [
                f"{retained}+{target} test accuracy, preferred format: {training['uniform']['test']['mean']:.2f} -> "
                f"{training[formula]['test']['mean']:.2f} (same weights permuted "
                f"{training[formula + '-permuted']['test']['mean']:.2f}{oracle})",
                # the demo scores with the family's fully trained large base: the experiment's strong world
                *evidence("ATLANTIS", "uniform", f"strong/{atlantis['cell']}: {formula}", results_dir),
            ],
        ),
        _block(
            "ATLAS",
            "LoRA -> ATLAS (1 family, 1 run)",
            [
                f"{target} accuracy / retained KL: {t['lora'][1]:.2f} / {t['lora'][5]:.4f} -> {t['atlas'][1]:.2f} / "
                f"{t['atlas'][5]:.4f} ({target_matched_text(results, short=True)})",
                *evidence("ATLAS", "lora", f"{target}/", results_dir),
            ],
        ),
    ]
    transfer = []
    for variant, entry in results["adapt"]["transfer"].items():
        smallest = {method: entry["curves"][method]["chosen"][0]["test"]["mean"] for method in ADAPT_SHOWN}
        transfer.append(
            f"{variant}: {retained}+{target} accuracy, own format: {smallest['cross-patch']:.2f} -> "
            f"{smallest['weight-delta']:.2f} ({smallest['distilled']:.2f})"
        )
    # the lab's evidence on this comparison: which of the two wins follows the base student's answer format; and
    # whether the distilled student beats cross-entropy training given the same compute, in the lab and on SmolLM2
    transfer += evidence("ADAPT", "preferred-sft", "format", results_dir)
    transfer += evidence("ADAPT", "ce-only", "equal FLOPs: middle", results_dir)
    transfer += evidence("ADAPT, real checkpoint", "ce-only", "equal FLOPs: middle", results_dir)
    blocks.append(_block("ADAPT", "cross-patch -> weight-delta (smallest size; distilled)", transfer))
    routing = [f"graded reversal: {adapt_routing_text(results)}"]
    routing += evidence("ADAPT", "random mix of fixed sizes", "routing/", results_dir)
    blocks.append(_block("ADAPT", "fixed sizes -> routing by length", routing))
    return "\n".join(blocks)


def write_plots(results: dict, out: Path) -> list[str]:
    """PNG plots next to the report."""
    written = []

    @contextlib.contextmanager
    def plot(name: str):
        figure, axis = pyplot().subplots(figsize=(5, 3.2))
        yield axis
        save_figure(figure, out / name)
        written.append(name)

    with plot("atlantis_weights.png") as axis:
        by_kind = results["atlantis"]["weights_by_kind"]
        axis.boxplot([by_kind[k] for k in by_kind], tick_labels=list(by_kind))
        axis.set_ylabel("ATLANTIS weight")
        axis.set_title(
            f"weights by true kind ({results['atlantis']['settings']['formulas'][0]}, "
            f"pool {results['atlantis']['cell']})"
        )

    with plot("atlas_retained_kl.png") as axis:
        for method, trajectory in results["atlas"]["retained_kl"].items():
            target_at = dict(map(tuple, results["atlas"].get("target_curve", {}).get(method, [])))
            points = [(target_at[step], kl) for step, kl in trajectory if step in target_at]
            if points:
                axis.plot(*zip(*points), marker="o", label=method)
        axis.set_xlabel(f"{results['skills']['target']} accuracy (checkpoints)")
        axis.set_ylabel("retained KL(frozen || current)")
        axis.legend()

    with plot("adapt_sizes.png") as axis:
        for variant, style in zip(results["adapt"]["transfer"], ("-", "--")):
            for method in ADAPT_SHOWN:
                chosen = results["adapt"]["transfer"][variant]["curves"][method]["chosen"]
                axis.plot([s["k"] for s in chosen], [s["test"]["mean"] for s in chosen], style, marker="o",
                          label=f"{variant} {method}")  # fmt: skip
        axis.set_xlabel("teacher blocks patched back (k)")
        axis.set_ylabel("accuracy (own format)")
        axis.legend(fontsize=6)
    return written


def write_report(results: dict, out: str | Path) -> Path:
    out = Path(out)
    plots = write_plots(results, out)
    config, seconds = results["config"], results["seconds"]
    retained, target, held_out = _roles(results)
    family = results["family"]
    sections = [
        *([family["warning"]] if family.get("warning") else []),
        "# kinfolk demo on the lab family",
        f"Family `{Path(family['root']).name}` ({'quick' if config['quick'] else 'full'}), seed {config['seed']}, "
        f"thresholds {'passed' if family['passed'] else 'NOT all passed'}. Skills: retained `{retained}`, "
        f"target `{target}`, held-out `{held_out}`. Accuracy = the correct answer in the asked-for format on test problems "
        f"({config['eval_problems']} per skill, greedy). Times (s): "
        + ", ".join(f"{k} {v}" for k, v in seconds.items())
        + ".",
        "## Headline\n\n```\n" + headline_table(results) + "\n```",
        "## Family\n\n"
        + markdown_table(
            ["model", *(f"{skill} acc / answer acc" for skill in (retained, target, held_out))],
            [
                [
                    name,
                    *(f"{s[k]['accuracy']:.2f} / {s[k]['answer_accuracy']:.2f}" for k in (retained, target, held_out)),
                ]
                for name, s in family["scores"].items()
            ],
        ),
        "## ATLANTIS: SFT of the large base on one pool (one run of the experiment's code)\n\n"
        f"Pool `{results['atlantis']['cell']}`; weights per byte, temperature "
        f"{results['atlantis']['settings']['temperatures'][0]:g}, 1/99 % quantile clip, self-normalised (the "
        "library's defaults). One family and one run: a reading of this run, not evidence of an effect; the "
        "5-family experiment is in docs/results.md.\n\n"
        + markdown_table(
            ["run", "validation acc", f"test {retained} acc", f"test {target} acc", "test acc", "ESS/N"],
            atlantis_rows(results),
        )
        + "\n\nEvery pool cell's weights against its own estimand (no training):\n\n"
        + markdown_table(
            [
                "cell",
                "rows",
                "Spearman",
                "AUC good",
                "mass good",
                "mass off-format",
                "mass wrong",
                "ESS/N",
                "transfer Spearman",
            ],
            formula_rows(results),
        ),
        "## ATLAS vs LoRA: learning the target skill\n\n"
        + markdown_table(
            [
                "model",
                f"{target} acc",
                f"{retained} acc",
                f"{retained} answer acc",
                f"{held_out} answer acc",
                "final retained KL",
            ],
            atlas_rows(results),
        )
        + "\n\n"
        + target_matched_text(results)
        + ".",
        "## ADAPT: every size of each variant's families\n\n"
        "Test accuracy in each variant's own format (`large_bracket` answers in `[...]`) at k = 0 (the student) .. M "
        "(the variant) teacher blocks patched back, each size in its validation-chosen patch order; one family and "
        "one budget, a reading of this run. Routing over the instruct variant's sizes by word length (graded "
        f"reversal): {adapt_routing_text(results)} ([plots](adapt_routing_distilled.png)).\n\n"
        + markdown_table(
            ["variant", "method", *(f"k{k}" for k in range(len(adapt_rows(results)[0]) - 2))], adapt_rows(results)
        ),
        "## lm-eval (kinfolk_lab_* tasks, exact match)\n\n"
        + markdown_table(["model", *next(iter(results["lm_eval"].values())).keys()], lm_eval_rows(results)),
        "## Plots\n\n" + "\n".join(f"![{p}]({p})" for p in plots),
    ]
    path = out / "report.md"
    with atomic_file(path) as handle:
        handle.write("\n\n".join(sections) + "\n")
    return path
