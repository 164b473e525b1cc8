"""Callback metrics in the trainer's own log record of a step, never in place of it.

transformers' `CallbackHandler.on_log` clears `control.should_log`. `DefaultFlowCallback` sets that flag in
`on_step_end`, before any user callback runs, and the trainer logs its loss, grad_norm and learning rate right
after `on_step_end` only if the flag is still set. A callback that calls `trainer.log()` from `on_step_end`
therefore deletes the trainer's record of that step from TensorBoard, W&B and `log_history`.

`log_step_metrics` instead adds the metrics to the trainer's next `log()` call when the trainer is about to log
this step, so one record carries both; otherwise (evaluation, train start and end, steps the trainer does not log)
nothing is pending and the metrics are logged as a record of their own.

>>> from types import SimpleNamespace
>>> class Trainer:
...     def __init__(self):
...         self.records = []
...     def log(self, logs, start_time=None):
...         self.records.append(dict(logs))
>>> trainer = Trainer()
>>> log_step_metrics(trainer, SimpleNamespace(should_log=True), {"retained_kl": 0.25})
>>> trainer.log({"loss": 1.5})  # the trainer's own record of the step
>>> log_step_metrics(trainer, SimpleNamespace(should_log=False), {"retained_kl": 0.5})
>>> trainer.records
[{'loss': 1.5, 'retained_kl': 0.25}, {'retained_kl': 0.5}]
"""

from __future__ import annotations

from typing import Any

_PENDING = "_kinfolk_pending_log_metrics"


def log_step_metrics(trainer: Any, control: Any, metrics: dict[str, float]) -> None:
    """Log `metrics` with the trainer's own record of this step if it is about to log one, else on their own."""
    if not metrics:
        return
    if control.should_log:
        _pending_metrics(trainer).update(metrics)
    else:
        trainer.log(dict(metrics))


def _pending_metrics(trainer: Any) -> dict[str, float]:
    """The metrics waiting for the trainer's next `log()` call; the first call wraps the trainer's `log`.

    The wrapper is an instance attribute around the bound method, so it sits above any subclass's `log` (TRL's
    trainers add their own metrics there) and every kinfolk callback on the trainer shares it.
    """
    pending = trainer.__dict__.get(_PENDING)
    if pending is None:
        pending = {}
        log = trainer.log

        def log_with_pending_metrics(logs: dict[str, float], *args, **kwargs):
            for name, value in pending.items():
                logs.setdefault(name, value)
            pending.clear()
            return log(logs, *args, **kwargs)

        trainer.log = log_with_pending_metrics
        setattr(trainer, _PENDING, pending)
    return pending
