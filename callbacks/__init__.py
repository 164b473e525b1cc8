"""`transformers.TrainerCallback`s that measure drift from the frozen model during training.

- `RetainedKLCallback`: mean next-token KL(frozen ‖ current) on fixed retained contexts (`retained_kl`).
- `LmEvalCallback`: lm-eval tasks on the training model, with answer churn against the frozen model.

Both add their metrics to the trainer's own log record of the step (`kinfolk.callbacks.step_log`) and append to
`<output_dir>/drift.jsonl`, which `kinfolk drift` reads.
"""

from kinfolk.callbacks.evaluation import LmEvalCallback
from kinfolk.callbacks.retained_kl import RetainedKLCallback

__all__ = ["LmEvalCallback", "RetainedKLCallback"]
