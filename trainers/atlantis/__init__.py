"""ATLANTIS: per-example SFT weights from how a small model's instruction tuning moved its probabilities.

`score_dataset` runs the large base, small base and reference models (those the formula reads: `large_base_only`
needs the large base alone) over an SFT dataset (cached, resumable, multi-process) and adds their response
log-probs and a `weight` column; `compute_weights` re-derives the weights
with other options without any forward pass (`reweight_dataset`: the same, IFD selection included, for a
scored dataset); `weight_report` / `compare_weights` diagnose them. The command
line is `kinfolk score`.
"""

from kinfolk.trainers.atlantis.config import FORMULAS, NORMALIZATIONS, ROLES, ScoreConfig, WeightConfig
from kinfolk.trainers.atlantis.diagnostics import compare_weights, format_report, weight_report, write_report
from kinfolk.trainers.atlantis.pipeline import reweight_dataset, score_dataset
from kinfolk.trainers.atlantis.preflight import check_scoring_inputs
from kinfolk.trainers.atlantis.scoring import ModelScores, ScoringError, score_model
from kinfolk.trainers.atlantis.selection import ifd_scores, select_top_fraction
from kinfolk.trainers.atlantis.weights import compute_weights

__all__ = [
    "FORMULAS",
    "NORMALIZATIONS",
    "ROLES",
    "ModelScores",
    "ScoreConfig",
    "ScoringError",
    "WeightConfig",
    "check_scoring_inputs",
    "compare_weights",
    "compute_weights",
    "format_report",
    "ifd_scores",
    "reweight_dataset",
    "score_dataset",
    "score_model",
    "select_top_fraction",
    "weight_report",
    "write_report",
]
