"""The drift report: compare methods by how far they move retained outputs to reach the same target score.

Each run (one method, one seed) is a training output directory whose `drift.jsonl` holds, per checkpoint step,
a retained KL (`retained_kl`, from `RetainedKLCallback`) and a target score (e.g.
`lm_eval/kinfolk_mbpp_plus/pass_at_1_count`, from `LmEvalCallback`, or rows you append yourself after
evaluating checkpoints with `kinfolk eval`). The comparison follows the ATLAS protocol:

1. for each target requirement k, a run's value is its lowest retained KL among checkpoints scoring ≥ k;
2. a run's mean KL averages those values over the requirements;
3. per seed, ratio = mean KL(method) / mean KL(comparator); ratios are summarised over seeds by their
   geometric mean (reduction = 1 − ratio), with a bootstrap interval over seeds only from
   `kinfolk.stats.MIN_INTERVAL_UNITS` (5) seeds on: with fewer, the report gives the per-seed values themselves,
   as the lab protocol asks, never a "95 %" interval.

A run whose target score never moved (the same at every checkpoint) is flagged: its "matched" KL is that of
whatever checkpoint came first, not of reaching a target.

Requirements default to the range every run reaches: from the highest of the runs' lowest scores to the lowest
of their highest scores (every integer when scores are counts, else every observed score in that range).

`kinfolk drift` (`kinfolk.commands.drift`) writes it from the command line:

    kinfolk drift --run atlas 1 runs/atlas-s1 --run atlas 2 runs/atlas-s2 \\
        --run lora 1 runs/lora-s1 --run lora 2 runs/lora-s2 \\
        --method atlas --target lm_eval/kinfolk_mbpp_plus/pass_at_1_count --out reports/mbpp
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kinfolk.atomic import atomic_directory
from kinfolk.callbacks.drift_log import read_rows, steps
from kinfolk.errors import InputError
from kinfolk.stats import MIN_INTERVAL_UNITS, geometric_mean, geometric_mean_interval


@dataclass
class Run:
    """One training run's checkpoints as (step, target score, retained KL)."""

    method: str
    seed: str
    path: str
    checkpoints: list[tuple[int, float, float]] = field(default_factory=list)

    def best_kl(self, requirement: float) -> float | None:
        """Lowest KL among checkpoints scoring at least `requirement` (None when none does)."""
        reaching = [kl for _, target, kl in self.checkpoints if target >= requirement]
        return min(reaching) if reaching else None


def load_run(method: str, seed: str, path: str | Path, target: str, kl: str = "retained_kl") -> Run:
    """Checkpoints of a run directory (or drift.jsonl file) that carry both the target and the KL."""
    merged = steps(read_rows(path))
    checkpoints = [
        (step, _number(row, target, path, step), _number(row, kl, path, step))
        for step, row in merged.items()
        if target in row and kl in row
    ]
    if not checkpoints:
        found = sorted({key for row in merged.values() for key in row if key.startswith(("lm_eval/", kl))})
        raise InputError(
            f"run {method}/{seed} ({path}) has no step with both {target!r} and {kl!r}; its rows carry {found}"
        )
    return Run(method, str(seed), str(path), checkpoints)


def _number(row: dict[str, Any], key: str, path: str | Path, step: int) -> float:
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{path}: step {step} has {key}={value!r}, not a finite number")
    return float(value)


def shared_requirements(runs: Sequence[Run]) -> list[float]:
    """Requirements every run reaches: integers (count scores) or observed scores, over the shared range."""
    low = max(min(target for _, target, _ in run.checkpoints) for run in runs)
    high = min(max(target for _, target, _ in run.checkpoints) for run in runs)
    if low > high:
        ranges = ", ".join(
            f"{run.method}/{run.seed}: [{min(t for _, t, _ in run.checkpoints):g}, {max(t for _, t, _ in run.checkpoints):g}]"
            for run in runs
        )
        raise InputError(f"the runs' target scores share no range ({ranges}); pass --requirements")
    scores = sorted({target for run in runs for _, target, _ in run.checkpoints})
    if all(float(score).is_integer() for score in scores):
        return [float(k) for k in range(math.ceil(low), math.floor(high) + 1)]
    return [score for score in scores if low <= score <= high]


def parse_requirements(text: str) -> list[float]:
    """ "148:160" (inclusive integer range) or "0.4,0.45,0.5"."""
    try:
        parts = [float(part) for part in text.split(":" if ":" in text else ",")]
    except ValueError:
        raise InputError(f"--requirements takes low:high or a list of scores such as 0.4,0.5; got {text!r}") from None
    if ":" in text:
        start, end = parts if len(parts) == 2 else (math.nan, math.nan)
        if not (start.is_integer() and end.is_integer()) or end < start:
            raise InputError(f"a range needs integers low:high, got {text!r}")
        return [float(k) for k in range(int(start), int(end) + 1)]
    return sorted(parts)


def target_matched(
    runs: Sequence[Run],
    method: str,
    requirements: Sequence[float] | None = None,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """The comparison as a JSON-able dict: per-run best KLs, per-method summaries, ratios to `method`."""
    methods = sorted({run.method for run in runs}, key=lambda name: (name != method, name))
    if method not in methods:
        raise InputError(f"method {method!r} has no runs; methods present: {methods}")
    requirements = list(requirements) if requirements is not None else shared_requirements(runs)
    unreached = [k for k in requirements if any(run.best_kl(k) is None for run in runs)]
    requirements = [k for k in requirements if k not in unreached]
    if not requirements:
        raise InputError(f"no requirement is reached by every run (unreached: {unreached})")
    by_key = {}
    for run in runs:
        if (run.method, run.seed) in by_key:
            raise InputError(
                f"two runs share method {run.method!r} and seed {run.seed!r}: {by_key[run.method, run.seed].path} "
                f"and {run.path}"
            )
        by_key[run.method, run.seed] = run
    best = {key: [run.best_kl(k) for k in requirements] for key, run in by_key.items()}
    mean_kl = {key: float(np.mean(values)) for key, values in best.items()}
    for key, value in mean_kl.items():
        if value <= 0:
            raise InputError(
                f"run {key[0]}/{key[1]} reaches the requirements with zero KL (a frozen checkpoint?); "
                "raise the lowest requirement"
            )

    def seeds_of(name: str) -> list[str]:
        return sorted(seed_ for method_, seed_ in by_key if method_ == name)

    summary = {}
    for name in methods:
        seeds = seeds_of(name)
        summary[name] = {
            "seeds": seeds,
            "mean_kl": geometric_mean([mean_kl[(name, s)] for s in seeds]),
            "best_kl_by_requirement": [
                geometric_mean([best[(name, s)][i] for s in seeds]) for i in range(len(requirements))
            ],
        }
    comparisons = {}
    for name in methods[1:]:
        seeds = sorted(set(seeds_of(method)) & set(seeds_of(name)))
        if not seeds:
            comparisons[name] = {"seeds": [], "note": f"no seed shared with {method}"}
            continue
        ratios = [mean_kl[(method, s)] / mean_kl[(name, s)] for s in seeds]
        if len(seeds) >= MIN_INTERVAL_UNITS:
            interval = geometric_mean_interval(ratios, n_resamples=n_resamples, confidence=confidence, seed=seed)
            ratio = interval.as_dict()
            reduction = {"estimate": 1 - interval.estimate, "low": 1 - interval.high, "high": 1 - interval.low}
        else:  # too few seeds for an interval: the values are the report
            ratio = {"estimate": geometric_mean(ratios)}
            reduction = {"estimate": 1 - ratio["estimate"]}
        per_requirement = [
            geometric_mean([best[(method, s)][i] / best[(name, s)][i] for s in seeds])
            for i in range(len(requirements))
        ]
        comparisons[name] = {
            "seeds": seeds,
            "ratio_by_seed": dict(zip(seeds, ratios)),
            "ratio": ratio,
            "reduction": reduction,
            "ratio_by_requirement": per_requirement,
        }
    flags = [
        f"run {run.method}/{run.seed}: its target never moved ({run.checkpoints[0][1]:g} at every checkpoint), so "
        "its KL is not matched to reaching a score"
        for run in runs
        if len({target for _, target, _ in run.checkpoints}) == 1
    ]
    return {
        "method": method,
        "flags": flags,
        "requirements": requirements,
        "unreached_requirements": unreached,
        "runs": [
            {
                "method": run.method,
                "seed": run.seed,
                "path": run.path,
                "mean_kl": mean_kl[(run.method, run.seed)],
                "best_kl": best[(run.method, run.seed)],
                "checkpoints": run.checkpoints,
            }
            for run in runs
        ],
        "methods": summary,
        "comparisons": comparisons,
    }


def markdown(report: dict[str, Any], target: str, kl: str) -> str:
    method, requirements = report["method"], report["requirements"]
    low, high = requirements[0], requirements[-1]
    lines = [
        f"# `{kl}` at matched target scores",
        "",
        f"Target `{target}`, {len(requirements)} requirements from {low:g} to {high:g}. A run's value at k is its "
        "lowest KL among checkpoints scoring ≥ k; mean KL averages the requirements within a seed and is "
        f"summarised over seeds geometrically. Ratios are {method}/comparator per seed, geometric mean over "
        f"seeds, with a bootstrap 95% interval over seeds from {MIN_INTERVAL_UNITS} seeds on (with fewer, the "
        f"per-seed ratios); below 1 favours {method}.",
        "",
        f"| method | seeds | mean KL | {method}/method | reduction |",
        "|---|---|---|---|---|",
    ]
    for name, summary in report["methods"].items():
        comparison = report["comparisons"].get(name)
        if comparison is None:
            ratio_cell, reduction_cell = "—", "—"
        elif "ratio" not in comparison:
            ratio_cell, reduction_cell = comparison["note"], "—"
        else:
            ratio = comparison["ratio"]
            if "low" in ratio:
                ratio_cell = f"{ratio['estimate']:.4f} [95% CI {ratio['low']:.4f}, {ratio['high']:.4f}]"
            else:
                values = ", ".join(f"{value:.4f}" for value in comparison["ratio_by_seed"].values())
                seeds = len(comparison["ratio_by_seed"])
                ratio_cell = f"{ratio['estimate']:.4f} ({seeds} seed{'s' * (seeds > 1)}: {values}; no interval)"
            reduction_cell = f"{100 * comparison['reduction']['estimate']:.2f}%"
        lines.append(
            f"| {name} | {len(summary['seeds'])} | {summary['mean_kl']:.4g} | {ratio_cell} | {reduction_cell} |"
        )
    lines += ["", "## Lowest KL per requirement (geometric mean over seeds)", ""]
    names = list(report["methods"])
    lines += ["| k | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for i, k in enumerate(requirements):
        cells = " | ".join(f"{report['methods'][name]['best_kl_by_requirement'][i]:.4g}" for name in names)
        lines.append(f"| {k:g} | {cells} |")
    if report.get("flags"):
        lines += ["", "## Flags", "", *(f"- {flag}" for flag in report["flags"])]
    if report["unreached_requirements"]:
        skipped = ", ".join(f"{k:g}" for k in report["unreached_requirements"])
        lines += ["", f"Requirements dropped because some run never reaches them: {skipped}."]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], target: str, kl: str, path: Path) -> None:
    """Retained KL against target score: every checkpoint, and each method's lowest-KL frontier."""
    import matplotlib  # a core dependency, imported here to keep it off the start-up path

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    colours = dict(zip(report["methods"], plt.rcParams["axes.prop_cycle"].by_key()["color"] * 10))
    for run in report["runs"]:
        points = [(target_, kl_) for _, target_, kl_ in run["checkpoints"] if kl_ > 0]
        if points:
            xs, ys = zip(*points)
            axis.scatter(xs, ys, s=14, alpha=0.45, color=colours[run["method"]])
    for name, summary in report["methods"].items():
        axis.step(
            report["requirements"], summary["best_kl_by_requirement"], where="post", color=colours[name], label=name
        )
    axis.set_yscale("log")
    axis.set_xlabel(target)
    axis.set_ylabel(f"{kl} (lower is less drift)")
    axis.set_title("Lowest retained KL reaching each target score")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=150)
    plt.close(figure)


def write_report(report: dict[str, Any], out: str | Path, overwrite: bool = False) -> str:
    """`report.md`, `report.json` and `drift.png` in the folder `out`, atomically; returns the markdown."""
    text = markdown(report, report["target"], report["kl"])
    with atomic_directory(out, overwrite=overwrite) as staging:
        (staging / "report.md").write_text(text, encoding="utf-8")
        (staging / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
        plot(report, report["target"], report["kl"], staging / "drift.png")
    return text
