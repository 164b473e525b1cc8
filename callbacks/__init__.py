"""`transformers.TrainerCallback`s that measure drift from the frozen model during training."""
