"""The measuring callbacks of an axolotl run, from its `kinfolk:` block: retained KL and the target score.

Both are kinfolk's own callbacks (`RetainedKLCallback`, `TargetMetricCallback` with `validation_nll`), given
axolotl's trainer: they add their metrics to axolotl's log record of the step (its console lines, TensorBoard,
W&B, `trainer_state.json`) and append rows to `drift.jsonl` in axolotl's `output_dir`, the file `kinfolk drift`
and `kinfolk compare`'s report read (row format: docs/measurement.md).
"""

from __future__ import annotations

from kinfolk.data import load_data
from kinfolk.integrations.axolotl.args import KinfolkOptions


def _rows(path: str, split: str, samples: int | None):
    rows = load_data(path, split)
    return rows if samples is None else rows.select(range(min(samples, len(rows))))


def measuring_callbacks(options: KinfolkOptions, trainer, sequence_len: int | None) -> list:
    """The callbacks the options ask for, built on `trainer` (their data loaded and tokenised now)."""
    from kinfolk.callbacks import RetainedKLCallback, TargetMetricCallback
    from kinfolk.callbacks.target_metric import validation_nll

    callbacks = []
    if options.retained_kl is not None:
        kl = options.retained_kl
        callbacks.append(
            RetainedKLCallback(
                trainer,
                _rows(options.retained_dataset, options.retained_split, kl.samples),
                positions=kl.positions,
                every_n_steps=kl.every_n_steps,
                cache=kl.cache,
                cache_top_k=kl.cache_top_k,
                divergence=kl.divergence,
                batch_size=kl.batch_size,
                max_length=kl.max_length or sequence_len,
                measure_at_start=kl.measure_at_start,
            )
        )
    if options.target is not None:
        target = options.target
        measure = validation_nll(
            _rows(target.dataset, target.split, None),
            trainer.processing_class,
            max_length=target.max_length or sequence_len,
            batch_size=target.batch_size,
        )
        callbacks.append(
            TargetMetricCallback(trainer, measure, every_n_steps=target.every_n_steps, metric_name=target.metric_name)
        )
    return callbacks
