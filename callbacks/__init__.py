"""`transformers.TrainerCallback`s that measure drift from the frozen model during training.

- `RetainedKLCallback`: mean next-token KL(frozen ‖ current) on fixed retained contexts (`retained_kl`).
- `LmEvalCallback`: lm-eval tasks on the training model, with answer churn against the frozen model.
- `TargetMetricCallback`: the score training aims at (validation NLL, a user's function or an lm-eval metric).

Each adds its metrics to the trainer's own log record of the step (`kinfolk.callbacks.step_log`) and appends to
`<output_dir>/drift.jsonl`, which `kinfolk drift` and `kinfolk compare` read.

Its names are imported on first use, so that importing one callback does not import the others' dependencies.
"""

from kinfolk.lazy import lazy_exports

# imported when one of their names is first asked for (`kinfolk.lazy`)
_EXPORTS = {
    "kinfolk.callbacks.evaluation": ("LmEvalCallback",),
    "kinfolk.callbacks.retained_kl": ("RetainedKLCallback",),
    "kinfolk.callbacks.target_metric": ("TargetMetricCallback",),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
