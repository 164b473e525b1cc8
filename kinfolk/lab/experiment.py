"""`kinfolk lab experiment atlantis --seeds N`: ATLANTIS weights against the lab's true ratio, over seeds.

Per seed (a fresh SFT pool drawn from p_d and a training seed; the family stays the one of `--family_seed`):

1. `score_dataset` scores the pool with the large base, small base and small instruct models (once);
2. every formula × length normalisation gives weights (no forward pass), compared with the true ratio p*/p_d:
   Spearman correlation and ESS/N;
3. `WeightedSFTTrainer` trains the large base on the pool with uniform weights, the true ratio (oracle) and each
   formula at `--normalization`; the target score is the accuracy (correct answer, preferred format) over the
   post-trained skills' test problems.

Differences from uniform are paired over (seed, test problem) units with a percentile bootstrap (`kinfolk.stats`);
`results.json` and `results.md` go to `--out`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kinfolk.lab import corpus
from kinfolk.lab.evaluate import generate_responses
from kinfolk.lab.family import POST_TRAINED_SKILLS, Family, LabConfig
from kinfolk.lab.report import markdown_table
from kinfolk.lab.seeded import run_over_seeds, seeds_title
from kinfolk.lab.skills import SKILLS, render
from kinfolk.lab.training import lab_trainer
from kinfolk.stats import bootstrap_interval, effective_sample_size, spearman


def correct_per_problem(model, tokenizer, n: int, seed: int = 0) -> np.ndarray:
    """1/0 per test problem (post-trained skills, `n` each): the correct answer in the preferred format."""
    outcomes = []
    for name in POST_TRAINED_SKILLS:
        problems = corpus.eval_problems(name, n, seed)
        responses = generate_responses(model, tokenizer, problems["prompt"])
        outcomes += [r == render(a) for r, a in zip(responses, problems["answer"])]
    return np.asarray(outcomes, dtype=np.float64)


def atlantis_seed(
    family: Family,
    seed: int,
    pool_size: int,
    steps: int,
    learning_rate: float,
    normalization: str,
    temperature: float,
    eval_problems: int,
    progress: bool,
) -> dict[str, Any]:
    from kinfolk.trainers.atlantis import FORMULAS, NORMALIZATIONS, compute_weights, score_dataset

    models, tokenizer = family.models, family.tokenizer()
    pool = corpus.pool_dataset(POST_TRAINED_SKILLS, pool_size, seed=1000 + seed)
    scored = score_dataset(
        pool,
        large_base=str(models["large_base"]),
        small_base=str(models["small_base"]),
        reference=str(models["small_instruct"]),
        use_cache=False,
        normalization=normalization,
        temperature=temperature,
    )
    true_ratio = np.asarray(scored["true_ratio"])
    diagnostics, columns = {}, {"uniform": [1.0] * len(scored), "oracle": true_ratio.tolist()}
    for formula in FORMULAS:
        for norm in NORMALIZATIONS:
            weights = np.asarray(
                compute_weights(scored, formula=formula, normalization=norm, temperature=temperature)["weight"]
            )
            diagnostics[f"{formula}/{norm}"] = {
                "spearman_true_ratio": spearman(weights, true_ratio),
                "ess_fraction": effective_sample_size(weights) / len(weights),
            }
            if norm == normalization:
                columns[formula] = weights.tolist()
    data = scored
    for name, values in columns.items():
        data = data.add_column(f"w_{name}", values)
    correct = {}
    for name in columns:
        with tempfile.TemporaryDirectory() as scratch:
            trainer = lab_trainer(
                models["large_base"],
                data,
                tokenizer,
                scratch,
                steps,
                learning_rate,
                seed=seed,
                weight_column=f"w_{name}",
                progress=progress,
            )
            trainer.train()
        correct[name] = correct_per_problem(trainer.model, tokenizer, eval_problems, seed=0).tolist()
    return {"diagnostics": diagnostics, "correct": correct}


def summarise(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    methods = list(per_seed[0]["correct"])
    pooled = {m: np.concatenate([np.asarray(s["correct"][m]) for s in per_seed]) for m in methods}
    summary: dict[str, Any] = {"accuracy": {}, "difference_vs_uniform": {}, "diagnostics": {}}
    for method in methods:
        summary["accuracy"][method] = bootstrap_interval(lambda x: float(x.mean()), pooled[method]).as_dict()
        if method != "uniform":
            summary["difference_vs_uniform"][method] = bootstrap_interval(
                lambda a, b: float((a - b).mean()), pooled[method], pooled["uniform"]
            ).as_dict()
    for key in per_seed[0]["diagnostics"]:
        for stat in ("spearman_true_ratio", "ess_fraction"):
            values = np.asarray([s["diagnostics"][key][stat] for s in per_seed])
            summary["diagnostics"].setdefault(key, {})[stat] = bootstrap_interval(
                lambda x: float(x.mean()), values
            ).as_dict()
    return summary


def _interval(entry: dict[str, float]) -> str:
    return f"{entry['estimate']:.3f} [{entry['low']:.3f}, {entry['high']:.3f}]"


def markdown(results: dict[str, Any]) -> list[str]:
    summary, settings = results["summary"], results["settings"]
    methods = list(summary["accuracy"])
    return [
        seeds_title("ATLANTIS", len(results["seeds"])),
        f"Family `{results['family']}`; pool {settings['pool_size']} rows; {settings['steps']} SFT steps per run; "
        f"weights normalised per `{settings['normalization']}`, temperature {settings['temperature']}. "
        "Accuracy: correct answer in the preferred format over "
        f"{' + '.join(POST_TRAINED_SKILLS)} test problems; intervals: paired percentile bootstrap (95 %) over "
        "(seed, problem) units.",
        markdown_table(
            ["weights", "accuracy", "difference vs uniform"],
            [
                [
                    m,
                    _interval(summary["accuracy"][m]),
                    _interval(summary["difference_vs_uniform"][m]) if m != "uniform" else "",
                ]
                for m in methods
            ],
        ),
        "Weights against the true ratio p*/p_d (mean over seeds, bootstrap over seeds):",
        markdown_table(
            ["formula/normalisation", "Spearman(w, p*/p_d)", "ESS/N"],
            [
                [key, _interval(d["spearman_true_ratio"]), _interval(d["ess_fraction"])]
                for key, d in summary["diagnostics"].items()
            ],
        ),
    ]


def run_atlantis(
    out: str | Path,
    seeds: int = 3,
    quick: bool = False,
    family_seed: int = 0,
    cache_dir: str | None = None,
    pool_size: int = 1536,
    steps: int = 150,
    learning_rate: float = 1e-3,
    normalization: str = "token",
    temperature: float = 0.5,
    eval_problems: int = 200,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    settings = {
        "pool_size": pool_size,
        "steps": steps,
        "learning_rate": learning_rate,
        "normalization": normalization,
        "temperature": temperature,
        "eval_problems": eval_problems,
    }
    return run_over_seeds(
        "atlantis",
        out,
        seeds,
        LabConfig.quick_config(seed=family_seed) if quick else LabConfig(seed=family_seed),
        settings,
        lambda family, seed: atlantis_seed(family, seed, **settings, progress=progress),
        summarise,
        markdown,
        cache_dir=cache_dir,
        overwrite=overwrite,
        progress=progress,
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if argv[:1] in (["atlas"], ["adapt"]):  # each experiment module parses its own options
        from importlib import import_module

        return import_module(f"kinfolk.lab.{argv[0]}_experiment").main(argv[1:])
    parser = argparse.ArgumentParser(prog="kinfolk lab experiment", description=__doc__.split("\n")[0])
    parser.add_argument(
        "method", choices=["atlantis", "atlas", "adapt"], help="the experiment (atlas, adapt: see their --help)"
    )
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (pools and training runs)")
    parser.add_argument("--quick", action="store_true", help="on the quick family")
    parser.add_argument("--family_seed", type=int, default=0, help="seed of the family the runs start from")
    parser.add_argument("--cache_dir", default=None, help="lab family cache")
    parser.add_argument("--pool_size", type=int, default=1536)
    parser.add_argument("--steps", type=int, default=150, help="SFT steps per run")
    parser.add_argument("--normalization", default="token", choices=["none", "token", "byte"])
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--eval_problems", type=int, default=200, help="test problems per skill")
    parser.add_argument("--out", default="runs/lab-atlantis")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    run_atlantis(
        args.out,
        args.seeds,
        args.quick,
        args.family_seed,
        args.cache_dir,
        args.pool_size,
        args.steps,
        normalization=args.normalization,
        temperature=args.temperature,
        eval_problems=args.eval_problems,
        overwrite=args.overwrite,
    )
    return 0


assert set(POST_TRAINED_SKILLS) <= set(SKILLS)
