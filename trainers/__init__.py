"""Trainers that drop into TRL: weighted SFT (ATLANTIS), distillation (ADAPT) and their regularisers."""

from kinfolk.trainers.layer_distillation_config import LayerDistillationConfig
from kinfolk.trainers.layer_distillation_trainer import LayerDistillationTrainer
from kinfolk.trainers.weighted_sft_config import WeightedSFTConfig
from kinfolk.trainers.weighted_sft_trainer import WeightedSFTTrainer

__all__ = ["LayerDistillationConfig", "LayerDistillationTrainer", "WeightedSFTConfig", "WeightedSFTTrainer"]
