"""Trainers that drop into TRL: weighted SFT (ATLANTIS), distillation (ADAPT) and their regularisers."""

from kinfolk.trainers.distillation_config import DistillationConfig
from kinfolk.trainers.distillation_trainer import DistillationTrainer

__all__ = ["DistillationConfig", "DistillationTrainer"]
