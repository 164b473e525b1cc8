"""`WeightedAxolotlTrainer`: axolotl's `AxolotlTrainer` whose loss weights each example as `WeightedSFTTrainer` does.

The loss is Σ_t W_t·ℓ_t / D (module docstring of `kinfolk.trainers.weighted_sft_trainer`): ℓ_t the token's negative
log-likelihood from `kinfolk.logprobs.label_log_probs` (the numbers `WeightedSFTTrainer` reduces, on every version of
TRL in kinfolk's window), W_t the collated `loss_weights`, D the normaliser `weight_reduction` names in the batch's
`weight_stats`, summed over every micro-batch of the optimiser step and, with `average_tokens_across_devices`, over
the ranks, as transformers counts `num_items_in_batch`. With every weight 1 and `weight_reduction: token` it is the
loss axolotl computes itself (Σ ℓ / number of label tokens).
"""

from __future__ import annotations

from typing import Any

import torch
from axolotl.core.trainers.base import AxolotlTrainer

from kinfolk.logprobs import label_log_probs
from kinfolk.trainers.weighted_sft_data import LOSS_WEIGHTS, NORMALIZER, STAT, TOKEN_COLUMNS, TOKEN_MASS, WEIGHT_STATS


class WeightedAxolotlTrainer(AxolotlTrainer):
    """`AxolotlTrainer` with kinfolk's example-weighted loss; `weight_reduction` is set by the plugin."""

    weight_reduction: str = "token"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._step_normalizer: torch.Tensor | None = None

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        self._signature_columns = [*self._signature_columns, *TOKEN_COLUMNS]  # the collator's, not the model's

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        self._step_normalizer = None
        if num_items_in_batch is not None and batch_samples:
            stat = STAT[NORMALIZER[self.weight_reduction]]
            total = sum(batch[WEIGHT_STATS][stat].to(device) for batch in batch_samples)
            if self.args.average_tokens_across_devices and self.args.world_size > 1:
                total = self.accelerator.gather(total).sum()
            self._step_normalizer = total
        return batch_samples, num_items_in_batch

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        weights = inputs.pop(LOSS_WEIGHTS)[:, 1:]
        inputs.pop(TOKEN_MASS)
        stats = inputs.pop(WEIGHT_STATS)
        in_step = num_items_in_batch is not None and self._step_normalizer is not None and model.training
        normalizer = self._step_normalizer if in_step else stats[STAT[NORMALIZER[self.weight_reduction]]]
        forward: dict[str, Any] = {name: inputs[name] for name in ("position_ids",) if name in inputs}
        log_probs, _ = label_log_probs(
            model, inputs["input_ids"], inputs.get("attention_mask"), inputs["labels"], **forward
        )
        weighted_sum = -(log_probs * weights.to(log_probs.dtype)).sum()
        loss = torch.where(normalizer > 0, weighted_sum / normalizer.clamp(min=1e-12), weighted_sum * 0)
        if in_step and self.args.average_tokens_across_devices:
            # DDP averages the ranks' gradients; D was summed over them (transformers scales its own loss alike)
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        return (loss, {"loss": loss}) if return_outputs else loss
