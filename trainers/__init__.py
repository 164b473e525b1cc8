"""Trainers that drop into TRL: weighted SFT (ATLANTIS), distillation (ADAPT) and their regularisers.

Its names are imported on first use: a config submodule (`weighted_sft_config`, read by `kinfolk sft --help`) loads
without the trainers' code. ATLANTIS's scoring, which writes the weights these trainers read, is a plug-in
(`kinfolk.plugins.atlantis`).
"""

from kinfolk.lazy import lazy_exports

# imported when one of their names is first asked for (`kinfolk.lazy`)
_EXPORTS = {
    "kinfolk.trainers.layer_distillation_config": ("LayerDistillationConfig",),
    "kinfolk.trainers.layer_distillation_trainer": ("LayerDistillationTrainer",),
    "kinfolk.trainers.weighted_sft_config": ("WeightedSFTConfig",),
    "kinfolk.trainers.weighted_sft_trainer": ("WeightedSFTTrainer",),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
