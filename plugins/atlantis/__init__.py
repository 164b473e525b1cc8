"""ATLANTIS: per-example SFT weights from how a small model's instruction tuning moved its probabilities.

`score_dataset` runs the large base, small base and reference models (those the formula reads: `large_base_only`
needs the large base alone) over an SFT dataset (cached, resumable, multi-process) and adds their response
log-probs and a `weight` column; `compute_weights` re-derives the weights
with other options without any forward pass (`reweight_dataset`: the same, IFD selection included, for a
scored dataset); `weight_report` / `compare_weights` diagnose them. The command
line is `kinfolk score`.

Its names are imported on first use, so that the options (`config`) load without torch (`kinfolk score --help`).
"""

from kinfolk.lazy import lazy_exports

# imported when one of their names is first asked for (`kinfolk.lazy`)
_EXPORTS = {
    "kinfolk.plugins.atlantis.config": ("FORMULAS", "NORMALIZATIONS", "ROLES", "ScoreConfig", "WeightConfig"),
    "kinfolk.plugins.atlantis.diagnostics": ("compare_weights", "format_report", "weight_report", "write_report"),
    "kinfolk.plugins.atlantis.pipeline": ("reweight_dataset", "score_dataset"),
    "kinfolk.plugins.atlantis.preflight": ("check_scoring_inputs",),
    "kinfolk.plugins.atlantis.scoring": ("ModelScores", "ScoringError", "score_model"),
    "kinfolk.plugins.atlantis.selection": ("ifd_scores", "select_top_fraction"),
    "kinfolk.plugins.atlantis.weights": ("compute_weights",),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
