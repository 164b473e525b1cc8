"""`kinfolk lab experiment atlas --seeds N`: ATLAS residuals and LoRA's regularised variants at matched target scores.

Per seed (adapter initialisation, atlas k-means and data order; the family stays the one of `--family_seed`), six
adapters at one placement and rank learn the target skill (reversal) from the large base:

- ATLAS with the `plain`, `centered` and full (`atlas`) residuals, each after `fit_atlas` on retained (copy) data;
- LoRA (`matching_lora_config`: same modules, same rank), LoRA + Replay (`replay_ratio`) and LoRA + Output-KL
  (`output_kl_coef`), the regularisers of `WeightedSFTTrainer` on the same retained data.

At `--drift_points` checkpoints `RetainedKLCallback` logs KL(frozen ‖ current) on held retained contexts and
`LmEvalCallback` runs the lab's lm-eval tasks: exact match on the target task, and answer churn on the retained task
against the frozen model's answers. The comparison is the paper's protocol (`kinfolk.drift_report`): for each target
score k that both a method and LoRA reach above the frozen model's score (`matched_levels`), each run's lowest
retained KL (and lowest churn, fewest correct → wrong answers) among checkpoints scoring ≥ k; per seed the mean over
those k, minus LoRA's. Differences are summarised over seeds with a percentile bootstrap (`kinfolk.stats`).
`results.json`, `results.md` and every run's `drift.jsonl` and final adapter go to `--out`.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from kinfolk.drift_report import Run
from kinfolk.lab.family import Family, LabConfig
from kinfolk.lab.report import markdown_table
from kinfolk.lab.seeded import run_over_seeds, seeds_title
from kinfolk.lab.skills import RETAINED, TARGET
from kinfolk.lab.tasks import TASKS
from kinfolk.stats import bootstrap_interval

ATLAS_RESIDUALS = {"atlas-plain": "plain", "atlas-centered": "centered", "atlas-full": "atlas"}
METHODS = (*ATLAS_RESIDUALS, "lora", "lora+replay", "lora+output-kl")
COMPARATOR = "lora"
REGULARISER_OPTIONS = {"lora+replay": "replay_ratio", "lora+output-kl": "output_kl_coef"}  # WeightedSFTConfig fields
TARGET_METRIC = f"lm_eval/{TASKS[TARGET]}/exact_match"
CHURN_METRIC = f"churn/{TASKS[RETAINED]}/C_rate"
KL_METRIC = "retained_kl"
FORGOT_METRIC = f"churn/{TASKS[RETAINED]}/F"  # retained answers the frozen model got right and the adapter gets wrong
MEASURES = {"kl": KL_METRIC, "churn": CHURN_METRIC, "forgot": FORGOT_METRIC}


def train_adapter(
    family: Family,
    method: str,
    seed: int,
    run_dir: Path,
    settings: dict[str, Any],
    progress: bool = False,
):
    """Train one method's adapter with drift logging into `run_dir`; returns the trainer."""
    from peft import get_peft_model
    from transformers import set_seed

    from kinfolk.callbacks import LmEvalCallback, RetainedKLCallback
    from kinfolk.lab.training import lab_trainer
    from kinfolk.plugins.atlas import AtlasConfig, fit_atlas
    from kinfolk.plugins.atlas.comparators import matching_lora_config

    tokenizer = family.tokenizer()
    retained, retained_eval = family.retained(settings["retained_examples"]), family.retained(128)
    atlas_config = AtlasConfig(
        r=settings["rank"],
        residual=ATLAS_RESIDUALS.get(method, "atlas"),
        num_regions=settings["regions"],
        layers_to_transform=[settings["layer"]],
        target_modules=[settings["module"]],
    )
    set_seed(seed)  # the adapter's random initialisation
    base = family.load("large_base")
    model = get_peft_model(
        base, atlas_config if method in ATLAS_RESIDUALS else matching_lora_config(base, atlas_config)
    )
    if method in ATLAS_RESIDUALS:
        fit_atlas(model, retained, tokenizer=tokenizer, progress=False, seed=seed)
    option = REGULARISER_OPTIONS.get(method)
    regulariser = {option: settings[option]} if option else {}
    shutil.rmtree(run_dir, ignore_errors=True)
    trainer = lab_trainer(
        model,
        family.target_train(settings["target_examples"]),
        tokenizer,
        run_dir,
        settings["steps"],
        settings["learning_rate"],
        seed=seed,
        progress=progress,
        retained_dataset=retained if regulariser else None,
        **regulariser,
    )
    every = max(1, settings["steps"] // settings["drift_points"])
    trainer.add_callback(RetainedKLCallback(trainer, retained_eval, every_n_steps=every, measure_at_start=True))
    trainer.add_callback(
        LmEvalCallback(
            trainer,
            [TASKS[TARGET], TASKS[RETAINED]],
            limit=settings["eval_problems"],
            every_n_steps=every,
            churn=True,
            include_defaults=False,
            batch_size=64,
        )
    )
    trainer.train()
    return trainer


def matched_levels(method: Run, comparator: Run, frozen_score: float) -> list[float]:
    """Target scores both runs reach: every score either run measured above the frozen model's, up to the lower
    of the two runs' best. A run whose first checkpoint already scores above k reaches k too, so, unlike
    `drift_report.shared_requirements`, the levels start at the frozen score, not at the higher first score.

    >>> lora = Run("lora", "0", "runs/lora", [(50, 0.1, 0.5), (100, 0.3, 0.8)])
    >>> atlas = Run("atlas", "0", "runs/atlas", [(50, 0.0, 0.1), (100, 0.2, 0.3)])
    >>> matched_levels(atlas, lora, frozen_score=0.0)
    [0.1, 0.2]
    """
    highest = min(max(target for _, target, _ in run.checkpoints) for run in (method, comparator))
    scores = {target for run in (method, comparator) for _, target, _ in run.checkpoints}
    return sorted(k for k in scores if frozen_score < k <= highest)


def matched_differences(run_dirs: dict[str, Path], frozen_score: float) -> dict[str, Any]:
    """Per method and measure (retained KL, churn, correct → wrong answers): the mean over `matched_levels` of the
    run's lowest value among checkpoints reaching each level, LoRA's on the same levels, and the difference;
    computed from the runs' `drift.jsonl`."""
    from kinfolk.drift_report import load_run

    def runs(method: str) -> dict[str, Run]:
        return {
            measure: load_run(method, "0", run_dirs[method], TARGET_METRIC, kl=key)
            for measure, key in MEASURES.items()
        }

    lora = runs(COMPARATOR)
    result: dict[str, Any] = {}
    for method in run_dirs:
        if method == COMPARATOR:
            continue
        ours = runs(method)
        levels = matched_levels(ours["kl"], lora["kl"], frozen_score)
        entry: dict[str, Any] = {"levels": levels}
        for measure in MEASURES:
            if levels:
                mine = float(np.mean([ours[measure].best_kl(k) for k in levels]))
                theirs = float(np.mean([lora[measure].best_kl(k) for k in levels]))
                entry[measure] = {"method": mine, COMPARATOR: theirs, "difference": mine - theirs}
        result[method] = entry
    return result


def frozen_target_score(run_dir: Path) -> float:
    """The frozen model's exact match on the target task, from the answers `LmEvalCallback` recorded at the start."""
    from kinfolk.callbacks.churn import outcomes
    from kinfolk.callbacks.evaluation import read_sample_dir

    answers = outcomes(read_sample_dir(run_dir / "lm_eval" / "frozen")[TASKS[TARGET]])
    return float(np.mean([answer.correct for answer in answers.values()]))


def atlas_seed(
    family: Family, seed: int, out: Path, settings: dict[str, Any], progress: bool = False
) -> dict[str, Any]:
    """Every method's run for one seed, its final target score and retained churn, and the matched differences."""
    from kinfolk.callbacks.drift_log import read_rows
    from kinfolk.lab.training import save_model

    tokenizer = family.tokenizer()
    run_dirs, final = {}, {}
    for method in METHODS:
        print(f"[kinfolk lab experiment atlas] seed {seed}: {method} ({settings['steps']} steps)", flush=True)
        start = time.perf_counter()
        run_dirs[method] = out / f"seed-{seed}" / "runs" / method
        trainer = train_adapter(family, method, seed, run_dirs[method], settings, progress)
        save_model(trainer.model, tokenizer, out / f"seed-{seed}" / "models" / method)
        rows = [row for row in read_rows(run_dirs[method]) if TARGET_METRIC in row]
        final[method] = {
            "target": rows[-1][TARGET_METRIC],
            "churn": rows[-1][CHURN_METRIC],
            "forgot": rows[-1][FORGOT_METRIC],
            "retained_kl": [row[KL_METRIC] for row in read_rows(run_dirs[method]) if KL_METRIC in row][-1],
            "seconds": round(time.perf_counter() - start, 1),
        }
    frozen_score = frozen_target_score(run_dirs[COMPARATOR])
    return {
        "frozen_target": frozen_score,
        "final": final,
        "matched": matched_differences(run_dirs, frozen_score),
        "runs": {method: str(path) for method, path in run_dirs.items()},
    }


def _mean_interval(values: list[float]) -> dict[str, float] | None:
    return bootstrap_interval(lambda x: float(x.mean()), values).as_dict() if values else None


def summarise(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Over seeds: each method's final target score, churn and KL, and its matched differences from LoRA."""
    summary: dict[str, Any] = {"final": {}, "matched": {}}
    for method in per_seed[0]["final"]:
        summary["final"][method] = {
            key: _mean_interval([seed["final"][method][key] for seed in per_seed])
            for key in ("target", "churn", "forgot", "retained_kl")
        }
    for method in per_seed[0]["matched"]:
        entries = [seed["matched"][method] for seed in per_seed]
        reached = [entry for entry in entries if entry["levels"]]
        summary["matched"][method] = {"seeds_matched": len(reached)}
        for measure in MEASURES:
            summary["matched"][method][measure] = {
                key: _mean_interval([entry[measure][key] for entry in reached])
                for key in ("method", COMPARATOR, "difference")
            }
    return summary


def _interval(entry: dict[str, float] | None, digits: int = 3) -> str:
    if entry is None:
        return "—"
    return f"{entry['estimate']:.{digits}f} [{entry['low']:.{digits}f}, {entry['high']:.{digits}f}]"


MEASURE_TITLES = {
    "kl": ("retained KL", 4),
    "churn": ("churn (changed retained answers / N)", 3),
    "forgot": ("retained answers turned correct → wrong (count)", 2),
}


def markdown(results: dict[str, Any]) -> list[str]:
    summary, settings, seeds = results["summary"], results["settings"], len(results["seeds"])
    body = [
        seeds_title("ATLAS", seeds),
        f"Family `{results['family']}` (family seed {results['family_seed']}); rank {settings['rank']}, layer "
        f"{settings['layer']} `{settings['module']}`, {settings['steps']} steps at lr {settings['learning_rate']}, "
        f"{settings['regions']} atlas regions; Replay ratio {settings['replay_ratio']}, Output-KL λ "
        f"{settings['output_kl_coef']}; N = {settings['eval_problems']} test problems per task at "
        f"{settings['drift_points']} checkpoints. Seeds vary the adapter initialisation, atlas fit and data order.",
        "Final checkpoint (mean over seeds, bootstrap 95 % over seeds): target exact match "
        f"({TASKS[TARGET]}), answer churn and correct → wrong answers on {TASKS[RETAINED]} against the frozen "
        "model's answers, retained KL.",
        markdown_table(
            ["method", "target", "churn", "correct → wrong", "retained KL"],
            [
                [
                    m,
                    _interval(e["target"]),
                    _interval(e["churn"]),
                    _interval(e["forgot"], 2),
                    _interval(e["retained_kl"], 4),
                ]
                for m, e in summary["final"].items()
            ],
        ),
        "At matched target scores: per seed, each run's lowest value among checkpoints scoring ≥ k, averaged over "
        "every score k above the frozen model's that both the method and LoRA reach; then the mean over the seeds "
        "(bootstrap 95 % over seeds). Negative differences favour the method.",
    ]
    for measure, (title, digits) in MEASURE_TITLES.items():
        rows = []
        for method, entry in summary["matched"].items():
            values = entry[measure]
            rows.append(
                [
                    method,
                    f"{entry['seeds_matched']}/{seeds}",
                    _interval(values["method"], digits),
                    _interval(values[COMPARATOR], digits),
                    _interval(values["difference"], digits),
                ]
            )
        body += [
            f"Matched {title}:",
            markdown_table(["method", "seeds matched", "method", "LoRA", "method − LoRA"], rows),
        ]
    return body


DEFAULTS = {
    "rank": 32,
    "layer": 3,
    "module": "self_attn.o_proj",
    "regions": 8,
    "steps": 600,
    "learning_rate": 1e-2,
    "drift_points": 8,
    "eval_problems": 200,
    "target_examples": 1024,
    "retained_examples": 512,
    "replay_ratio": 0.25,
    "output_kl_coef": 1.0,
}
QUICK = {"steps": 150, "drift_points": 4, "eval_problems": 100}


def run_atlas(
    out: str | Path,
    seeds: int = 3,
    quick: bool = False,
    family_seed: int = 0,
    cache_dir: str | None = None,
    overwrite: bool = False,
    progress: bool = False,
    **overrides,
) -> dict[str, Any]:
    settings = DEFAULTS | (QUICK if quick else {}) | {k: v for k, v in overrides.items() if v is not None}
    return run_over_seeds(
        "atlas",
        out,
        seeds,
        LabConfig.quick_config(seed=family_seed) if quick else LabConfig(seed=family_seed),
        settings,
        lambda family, seed: atlas_seed(family, seed, Path(out), settings, progress),
        summarise,
        markdown,
        cache_dir=cache_dir,
        overwrite=overwrite,
        progress=progress,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kinfolk lab experiment atlas", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (adapter init, data order)")
    parser.add_argument("--quick", action="store_true", help="on the quick family with quick budgets")
    parser.add_argument("--family_seed", type=int, default=0, help="seed of the family the adapters start from")
    parser.add_argument("--cache_dir", default=None, help="lab family cache")
    parser.add_argument("--steps", type=int, default=None, help=f"adapter steps (default {DEFAULTS['steps']})")
    parser.add_argument("--drift_points", type=int, default=None, help="checkpoints measured per run")
    parser.add_argument("--eval_problems", type=int, default=None, help="test problems per task")
    parser.add_argument("--replay_ratio", type=float, default=None, help="Replay's share of retained examples")
    parser.add_argument("--output_kl_coef", type=float, default=None, help="Output-KL's λ")
    parser.add_argument("--out", default="runs/lab-atlas")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--progress", action="store_true", help="show the trainers' progress bars")
    args = parser.parse_args(argv)
    run_atlas(
        args.out,
        args.seeds,
        args.quick,
        args.family_seed,
        args.cache_dir,
        args.overwrite,
        args.progress,
        steps=args.steps,
        drift_points=args.drift_points,
        eval_problems=args.eval_problems,
        replay_ratio=args.replay_ratio,
        output_kl_coef=args.output_kl_coef,
    )
    return 0
