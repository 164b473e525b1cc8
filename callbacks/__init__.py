"""`transformers.TrainerCallback`s that measure drift from the frozen model during training.

- `RetainedKLCallback`: mean next-token KL(frozen ‖ current) on fixed retained contexts (`retained_kl`).
- `LmEvalCallback`: lm-eval tasks on the training model, with answer churn against the frozen model.
- `TargetMetricCallback`: the score training aims at (validation NLL, a user's function or an lm-eval metric).

Each adds its metrics to the trainer's own log record of the step (`kinfolk.callbacks.step_log`) and appends to
`<output_dir>/drift.jsonl`, which `kinfolk drift` and `kinfolk compare` read.
"""

from kinfolk.callbacks.evaluation import LmEvalCallback
from kinfolk.callbacks.retained_kl import RetainedKLCallback
from kinfolk.callbacks.target_metric import TargetMetricCallback

__all__ = ["LmEvalCallback", "RetainedKLCallback", "TargetMetricCallback"]
