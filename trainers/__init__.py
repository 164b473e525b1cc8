"""Trainers that drop into TRL: weighted SFT (ATLANTIS), distillation (ADAPT) and their regularisers."""
