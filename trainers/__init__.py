"""Trainers that drop into TRL: weighted SFT (ATLANTIS), distillation (ADAPT) and their regularisers."""

from kinfolk.trainers.distillation_config import DistillationConfig
from kinfolk.trainers.distillation_trainer import DistillationTrainer
from kinfolk.trainers.weighted_sft_config import WeightedSFTConfig
from kinfolk.trainers.weighted_sft_trainer import WeightedSFTTrainer

__all__ = ["DistillationConfig", "DistillationTrainer", "WeightedSFTConfig", "WeightedSFTTrainer"]
