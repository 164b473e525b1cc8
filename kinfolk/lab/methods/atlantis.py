"""ATLANTIS in the lab: the weight formulas, each judged against its own estimand, on one family's pools.

The paper's Eq. 7 (`ratio`, a − b) estimates p*/p_r for responses drawn from the reference model p_r; Algorithm 1
(`algorithm1`, a − b + c) and Eq. 8 (`influence`, c − b) read the reference model too (a, b, c: log-probs of the
large base, small base and reference). So the experiment crosses where the SFT pool comes from with what it holds:

| cell | responses drawn from | estimand |
|---|---|---|
| `pd-both` | p_d: 40 % ideal, 30 % off-format, 30 % wrong answers | p*/p_d |
| `pd-wrong` | p_d: 40 % ideal, 60 % wrong answers | p*/p_d |
| `pd-off_format` | p_d: 40 % ideal, 60 % off-format | p*/p_d |
| `pr` | the reference model p_r itself (Eq. 7's own setting) | p*/p_r |
| `mix` | half from p_r, half from p_d (both), density q = (p_r + p_d) / 2 | p*/q |

p* puts all its mass on the correct answer in the preferred format, so every estimand is zero for any other
response; p_d is known by construction and p_r is the reference model's own sequence probability. The family's
reference (`small_instruct`) is trained on an imperfect proxy of p*, and its small base knows less of the target
skill than the large base, so a − b carries signal where the reference is weak.

Per family and run (a fresh pool draw and training seed):

1. cheap diagnostics for every cell: each formula × normalisation × temperature against the estimand — Spearman,
   AUC of ideal responses against the rest, the weight mass on each response kind, ESS/N, max/median weight — and
   the paper's proportional-transfer assumption as a property of the lab: the correlation over pool rows of the
   large and the small instruct-minus-base shifts (log p_LI − a against c − b);
2. training runs on the cells in `training_cells` (`pr` and `pd-both`): `WeightedSFTTrainer` trains the large base
   on the pool with uniform weights, the estimand (oracle), each formula at the temperature whose run scores best on
   validation problems (the library's defaults otherwise: per-byte normalisation, 1/99 % quantile clipping,
   self-normalised), and each formula's chosen weights permuted across rows (the same weights and ESS on random
   rows: does it matter *which* rows get weight, or only the spread?). The score is the accuracy (correct answer in
   the preferred format) on the family's own copy + reverse test problems.

`atlantis_family` makes one family's record of all this (the demo runs it on one family); version 1 ran it over
families, and the registered `atlantis` experiment (`kinfolk.lab.experiments.atlantis`) re-analyses those committed
records; `atlantis-controls` (version 3) reuses the pools, scoring and training here.

>>> FORMULA_NAMES, TRAINING_CELLS
(('ratio', 'algorithm1', 'influence'), ('pr', 'pd-both'))
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset

from kinfolk.lab.methods.cache import cached_json
from kinfolk.lab.world import corpus
from kinfolk.lab.world.evaluate import generate_responses, sample_responses
from kinfolk.lab.world.family import POST_TRAINED_SKILLS, Family
from kinfolk.lab.world.skills import NOISE_MIXES, RESPONSE_KINDS, SKILLS, pool_log_probability, render, response_kind
from kinfolk.lab.world.training import lab_trainer, save_model, single_threaded
from kinfolk.stats import auc, effective_sample_size, pearson, spearman

FORMULA_NAMES = ("ratio", "algorithm1", "influence")  # kinfolk.plugins.atlantis.FORMULAS, without the import cost
CELLS = ("pd-both", "pd-wrong", "pd-off_format", "pr", "mix")
TRAINING_CELLS = ("pr", "pd-both")
REFERENCE_SHARE_IN_MIX = 0.5
LOG_ESTIMAND = "log_estimand"  # log of the cell's true importance ratio p*/q (-inf where p* is 0)
LARGE_INSTRUCT_LOGPROB = "large_instruct_logprob"


@dataclass
class AtlantisSettings:
    """What one family's ATLANTIS runs do; its hash keys the per-family records, so a changed setting reruns."""

    pool_size: int = field(default=1536, metadata={"help": "Rows of each SFT pool (copy and reverse, alternating)."})
    runs: int = field(default=1, metadata={"help": "Runs per family (pool draw and training seed)."})
    steps: int = field(default=150, metadata={"help": "SFT steps of each training run."})
    learning_rate: float = field(default=1e-3, metadata={"help": "Peak learning rate of the SFT runs."})
    normalization: str = field(default="byte", metadata={"help": "Length normalisation of the trained weights."})
    temperatures: list[float] = field(
        default_factory=lambda: [0.5, 1.0, 2.0],
        metadata={"help": "Temperatures each formula is trained at; validation accuracy picks one per run."},
    )
    diagnostic_temperatures: list[float] = field(
        default_factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0],
        metadata={"help": "Temperatures of the cheap diagnostics (no training)."},
    )
    formulas: list[str] = field(
        default_factory=lambda: list(FORMULA_NAMES), metadata={"help": "Formulas of the training runs."}
    )
    training_cells: list[str] = field(
        default_factory=lambda: list(TRAINING_CELLS), metadata={"help": "Pool cells with training runs."}
    )
    eval_problems: int = field(default=200, metadata={"help": "Test problems per skill (copy, reverse)."})
    validation_problems: int = field(default=200, metadata={"help": "Validation problems per skill."})

    def __post_init__(self) -> None:
        unknown = sorted(set(self.training_cells) - set(CELLS)) + sorted(set(self.formulas) - set(FORMULA_NAMES))
        if unknown:
            raise ValueError(f"unknown cells or formulas {unknown}: cells {list(CELLS)}, formulas {FORMULA_NAMES}")


# ------------------------------------------------------------------------------------------------ pools
def _with_kinds(rows: list[dict[str, Any]]) -> Dataset:
    for row in rows:
        row["kind"] = response_kind(SKILLS[row["skill"]], row["prompt"], row["completion"])
    return Dataset.from_list(rows)


def reference_pool(family: Family, n: int, draw: int) -> Dataset:
    """`n` training prompts answered by sampling the reference model; rows without EOS or with a blank response
    (which the scorer refuses) are dropped, and the record's row count says how many remained."""
    problems = corpus.ideal_dataset(POST_TRAINED_SKILLS, n, 7000 + 1000 * family.config.seed + draw)
    responses = sample_responses(family.load("small_instruct"), family.tokenizer(), problems["prompt"], seed=draw)
    rows = [
        {"prompt": p, "completion": r, "skill": s}
        for p, r, s in zip(problems["prompt"], responses, problems["skill"])
        if r is not None and r.strip()
    ]
    return _with_kinds(rows)


def make_pool(family: Family, cell: str, n: int, draw: int) -> Dataset:
    """The cell's pool: prompt, completion, skill, kind and (for p_d rows) log p_d of the response."""
    if cell.startswith("pd-"):
        pool = family.pool(n, draw, NOISE_MIXES[cell.removeprefix("pd-")])
        return pool.select_columns(["prompt", "completion", "skill", "kind", "pool_logprob"])
    if cell == "pr":
        return reference_pool(family, n, draw)
    if cell == "mix":
        from_reference = reference_pool(family, round(n * REFERENCE_SHARE_IN_MIX), draw).to_list()
        from_pool = family.pool(n - round(n * REFERENCE_SHARE_IN_MIX), draw).to_list()
        return _with_kinds([{k: r[k] for k in ("prompt", "completion", "skill")} for r in from_reference + from_pool])
    raise ValueError(f"unknown cell {cell!r}; cells: {list(CELLS)}")


def score_pool(family: Family, pool: Dataset, cell: str) -> Dataset:
    """a, b, c (and the large instruct model's log-prob) per row, then the log of the cell's estimand."""
    from kinfolk.plugins.atlantis import score_dataset
    from kinfolk.plugins.atlantis.config import ScoreConfig
    from kinfolk.plugins.atlantis.scoring import score_model

    models = {name: str(path) for name, path in family.models.items()}
    scored = score_dataset(
        pool,
        large_base=models["large_base"],
        small_base=models["small_base"],
        reference=models["small_instruct"],
        use_cache=False,
    )
    large_instruct = score_model(pool, models["large_instruct"], "large_instruct", ScoreConfig(use_cache=False))
    scored = scored.add_column(LARGE_INSTRUCT_LOGPROB, large_instruct.logprob.tolist())
    return scored.add_column(LOG_ESTIMAND, log_estimand(scored, cell).tolist())


def log_estimand(scored: Dataset, cell: str) -> np.ndarray:
    """log p*/q for each row, q the density the cell's responses were drawn from (-inf where p* is zero)."""
    good = np.asarray(scored["kind"]) == "good"
    log_reference = np.asarray(scored["reference_logprob"], dtype=np.float64)
    if cell.startswith("pd-"):
        log_density = np.asarray(scored["pool_logprob"], dtype=np.float64)
    elif cell == "pr":
        log_density = log_reference
    else:  # mix: q = share · p_r + (1 − share) · p_d, p_d of the default (both-noise) mixture
        pool = np.asarray(
            [
                np.exp(pool_log_probability(SKILLS[row["skill"]], row["prompt"], row["completion"]))
                for row in scored.select_columns(["skill", "prompt", "completion"])
            ]
        )
        share = REFERENCE_SHARE_IN_MIX
        log_density = np.log(share * np.exp(log_reference) + (1 - share) * pool)
    return np.where(good, -log_density, -np.inf)  # log p* = 0 on the ideal response


def oracle_weights(scored: Dataset) -> np.ndarray:
    """The estimand itself, self-normalised to mean 1 (what importance sampling with the truth would use)."""
    weights = np.exp(np.asarray(scored[LOG_ESTIMAND], dtype=np.float64))
    return weights / weights.mean()


# ------------------------------------------------------------------------------------------------ diagnostics
def weight_diagnostics(weights: np.ndarray, estimand: np.ndarray, kinds: np.ndarray) -> dict[str, float]:
    """How weights agree with an estimand: rank correlation, AUC of ideal rows, mass per kind, ESS, tail."""
    return {
        "spearman": spearman(weights, estimand),
        "auc_good": auc(weights, kinds == "good"),
        **{f"mass_{kind}": float(weights[kinds == kind].sum() / weights.sum()) for kind in RESPONSE_KINDS},
        "ess_fraction": effective_sample_size(weights) / len(weights),
        "max_over_median": float(weights.max() / median) if (median := float(np.median(weights))) > 0 else None,
    }


def diagnose(scored: Dataset, temperatures: list[float]) -> dict[str, dict[str, float]]:
    """`weight_diagnostics` for every formula × normalisation × temperature, keyed "formula/normalisation/T"."""
    from kinfolk.plugins.atlantis import FORMULAS, NORMALIZATIONS, compute_weights

    estimand = np.exp(np.asarray(scored[LOG_ESTIMAND], dtype=np.float64))
    kinds = np.asarray(scored["kind"])
    table = {"oracle": weight_diagnostics(oracle_weights(scored), estimand, kinds)} if estimand.any() else {}
    for formula in FORMULAS:
        for normalization in NORMALIZATIONS:
            for temperature in temperatures:
                weights = np.asarray(
                    compute_weights(scored, formula=formula, normalization=normalization, temperature=temperature)[
                        "weight"
                    ]
                )
                table[f"{formula}/{normalization}/{temperature:g}"] = weight_diagnostics(weights, estimand, kinds)
    return table


def proportional_transfer(scored: Dataset) -> dict[str, float]:
    """The paper's assumption p*/p_bL ∝ p_r/p_bS, read as: the large instruct-minus-base shift (log p_LI − a)
    moves with the small one (c − b) over the pool's rows. Correlations per sequence and per byte."""
    large_shift = np.asarray(scored[LARGE_INSTRUCT_LOGPROB]) - np.asarray(scored["large_base_logprob"])
    small_shift = np.asarray(scored["reference_logprob"]) - np.asarray(scored["small_base_logprob"])
    per_byte = np.asarray(scored["response_bytes"], dtype=np.float64)
    return {
        "pearson": pearson(large_shift, small_shift),
        "spearman": spearman(large_shift, small_shift),
        "pearson_per_byte": pearson(large_shift / per_byte, small_shift / per_byte),
    }


# ------------------------------------------------------------------------------------------------ training
def accuracy(model, tokenizer, n: int, seed: int, split: str) -> dict[str, float]:
    """Share of correct answers in the preferred format on `n` problems per post-trained skill, and their mean."""
    scores = {}
    for name in POST_TRAINED_SKILLS:
        problems = corpus.eval_problems(name, n, seed, split)
        responses = generate_responses(model, tokenizer, problems["prompt"])
        scores[name] = float(np.mean([r == render(a) for r, a in zip(responses, problems["answer"])]))
    scores["mean"] = float(np.mean([scores[name] for name in POST_TRAINED_SKILLS]))
    return scores


def train_and_score(
    family: Family,
    data: Dataset,
    weights: np.ndarray,
    seed: int,
    settings: AtlantisSettings,
    keep_model: Path | None = None,
) -> dict[str, Any]:
    """SFT of the large base on `data` with `weights`; accuracies on the family's validation and test problems.
    `keep_model` saves the trained model there (the demo keeps the models its report's numbers come from)."""
    tokenizer = family.tokenizer()
    with tempfile.TemporaryDirectory() as scratch:
        trainer = lab_trainer(
            family.models["large_base"],
            data.add_column("run_weight", weights.tolist()),
            tokenizer,
            scratch,
            settings.steps,
            settings.learning_rate,
            seed=seed,
            weight_column="run_weight",
            progress=False,
        )
        trainer.train()
    if keep_model is not None:
        save_model(trainer.model, tokenizer, keep_model)
    family_seed = family.config.seed
    return {
        "validation": accuracy(trainer.model, tokenizer, settings.validation_problems, family_seed, "validation"),
        "test": accuracy(trainer.model, tokenizer, settings.eval_problems, family_seed, "test"),
        "ess_fraction": effective_sample_size(weights) / len(weights),
    }


def formula_weights(scored: Dataset, formula: str, settings: AtlantisSettings, temperature: float) -> np.ndarray:
    from kinfolk.plugins.atlantis import compute_weights

    return np.asarray(
        compute_weights(scored, formula=formula, normalization=settings.normalization, temperature=temperature)[
            "weight"
        ]
    )


def training_cell(
    family: Family,
    scored: Dataset,
    run: int,
    settings: AtlantisSettings,
    work: Path,
    keep_models: Path | None = None,
) -> dict[str, Any]:
    """Uniform, oracle, each formula at its validation-chosen temperature and its permuted control.

    Each training run's result is kept under `work` as soon as it is done, so a stopped family resumes;
    `keep_models` also keeps each trained model (as `<keep_models>-<method>`)."""
    seed = 100 * family.config.seed + run
    data = scored.select_columns(["prompt", "completion"])

    def trained(name: str, weights: np.ndarray) -> dict[str, Any]:
        keep = None if keep_models is None else keep_models.with_name(f"{keep_models.name}-{name}")
        return cached_json(work / f"{name}.json", lambda: train_and_score(family, data, weights, seed, settings, keep))

    has_ideal = bool(np.any(np.asarray(scored["kind"]) == "good"))
    results: dict[str, Any] = {
        "uniform": trained("uniform", np.ones(len(scored))),
        "oracle": trained("oracle", oracle_weights(scored)) if has_ideal else None,  # no ideal row: no oracle
    }
    for formula in settings.formulas:
        weights = {t: formula_weights(scored, formula, settings, t) for t in settings.temperatures}
        by_temperature = {f"{t:g}": trained(f"{formula}-T{t:g}", w) for t, w in weights.items()}
        chosen = max(weights, key=lambda t: by_temperature[f"{t:g}"]["validation"]["mean"])  # first best on ties
        permuted = np.random.default_rng(seed).permutation(weights[chosen])
        results[formula] = {"temperature": chosen, **by_temperature[f"{chosen:g}"], "by_temperature": by_temperature}
        results[f"{formula}-permuted"] = trained(f"{formula}-permuted", permuted)
    return results


def measure_cell(family: Family, cell: str, run: int, settings: AtlantisSettings, work: Path) -> dict[str, Any]:
    """Draw and score the cell's pool (kept under `work/scored`), then its diagnostics and transfer correlations."""
    scored = score_pool(family, make_pool(family, cell, settings.pool_size, draw=run), cell)
    scored.save_to_disk(str(work / "scored"))
    kinds = np.asarray(scored["kind"])
    return {
        "rows": len(scored),
        "kinds": {kind: int(np.sum(kinds == kind)) for kind in RESPONSE_KINDS},
        "diagnostics": diagnose(scored, settings.diagnostic_temperatures),
        "transfer": proportional_transfer(scored),
    }


def atlantis_family(
    family: Family, work: Path, settings: AtlantisSettings, keep_models: Path | None = None
) -> dict[str, Any]:
    """One family's record: per run, every cell's diagnostics and transfer correlations, the training cells' runs
    (`keep_models`: a directory that keeps the trained models, as `atlantis-<cell>-<method>`)."""
    runs = []
    with single_threaded():
        for run in range(settings.runs):
            record: dict[str, Any] = {"run": run, "cells": {}}
            for cell in CELLS:
                cell_work = work / f"run{run}" / cell
                entry = cached_json(
                    cell_work / "diagnostics.json",
                    lambda cell=cell, cell_work=cell_work, run=run: measure_cell(
                        family, cell, run, settings, cell_work
                    ),
                )
                if cell in settings.training_cells:
                    scored = Dataset.load_from_disk(str(cell_work / "scored"))
                    keep = None if keep_models is None else keep_models / f"atlantis-{cell}"
                    entry["training"] = training_cell(family, scored, run, settings, cell_work / "training", keep)
                record["cells"][cell] = entry
            runs.append(record)
    return {"runs": runs}
