"""`WeightedSFTTrainer`: TRL's `SFTTrainer` with a per-example weight read from a dataset column (ATLANTIS).

The loss is Σ_t W_t·ℓ_t / D, with ℓ_t the token's negative log-likelihood from TRL's fused LM head and
W_t = (example weight) × (1 on the tokens SFTTrainer trains, `prompt_loss_weight` on the others). D depends on
`weight_reduction`: `token` Σ_t (token weights), `sequence` the number of examples, `self_normalized` Σ_t W_t. D is
summed over every micro-batch of an optimiser step and, with `average_tokens_across_devices`, over every rank, as
transformers does for its token count, so gradient accumulation and DDP give the update of the one merged batch.
With all weights 1 and `prompt_loss_weight=0` the `token` loss is SFTTrainer's, value for value.

Data: TRL prepares the dataset (chat template, EOS, completion and assistant masks, its prompt/completion
boundary); the example weight and the prompt/completion split are then written on every token, so they survive
truncation, packing (each packed example keeps its own weight) and padding-free collation. Packing with
`packing_strategy="wrapped"` cuts examples without recording where they start: the `sequence` reduction, which
counts examples, refuses it, and the logged weight statistics treat each wrapped row as one example.

Against forgetting, on retained data: Replay (`replay_ratio`), Output-KL (`output_kl_coef`), `regularisers`.

Logged on top of TRL's metrics: `unweighted_loss`, the mean token loss with every example weight 1 (Σ M·ℓ / Σ M,
M the token loss weight), pooled over each optimiser step's micro-batches and ranks and averaged since the last log
as `loss` is, so runs with different weightings compare on it (with unit weights and the `token` reduction it is
`loss`; `eval_unweighted_loss` in evaluation); with a weight column `weight/mean`, `weight/min`, `weight/max` over
the examples seen since the last log and `weight/batch_ess`, the micro-batches' mean Kish ESS (Σw)²/Σw²
(`eval_weight/*` with `weight_eval_loss`); with Output-KL, `output_kl`. A weight column whose weights are all 0
(after clipping) is refused when the dataset is prepared: it would train nothing (a streamed dataset cannot be
checked in advance).

>>> import tempfile
>>> from kinfolk.testing import build_model, build_tokenizer, prompt_completion_dataset
>>> from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer
>>> data = prompt_completion_dataset(8).add_column("weight", [0.5, 2.0] * 4)
>>> tokenizer = build_tokenizer()
>>> trainer = WeightedSFTTrainer(
...     model=build_model("llama", tokenizer=tokenizer),
...     args=WeightedSFTConfig(tempfile.mkdtemp(), use_cpu=True, max_steps=1, per_device_train_batch_size=4),
...     train_dataset=data,
...     processing_class=tokenizer,
... )
>>> trainer.train_dataset[0]["example_weights"][:3]
[0.5, 0.5, 0.5]
>>> trainer.train()  # logs loss, entropy, mean_token_accuracy, num_tokens and weight/mean, min, max, batch_ess
... # doctest: +SKIP
"""

from __future__ import annotations

import copy
import math
from typing import Any, ClassVar

import torch
from datasets import Dataset, IterableDataset
from transformers import TrainingArguments
from transformers.utils import logging
from trl import SFTTrainer
from trl.data_utils import pack_dataset
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling
from trl.trainer.utils import global_then_local_main_first

from kinfolk.compat.trl import FUSED_KERNELS, chunked_nll_metrics, label_log_probs_from_logits, seed_adapter_init
from kinfolk.data import load_data
from kinfolk.errors import DatasetFormatError, EmptyDatasetError
from kinfolk.launch_check import warn_if_fewer_processes
from kinfolk.tokens import IGNORE_INDEX, dataset_type
from kinfolk.trainers.atomic_checkpoints import AtomicCheckpointsMixin
from kinfolk.trainers.regularisers import OutputKL, RetainedBatches, check_output_kl_trainer, replay_mix
from kinfolk.trainers.weighted_sft_config import WeightedSFTConfig
from kinfolk.trainers.weighted_sft_data import (
    LOSS_WEIGHTS,
    NORMALIZER,
    STAT,
    TOKEN_COLUMNS,
    TOKEN_MASS,
    WEIGHT_STATS,
    WeightedCollator,
    WeightTransform,
    has_completion_token,
    token_weight_columns,
)

logger = logging.get_logger(__name__)


class _WeightedLogProbs:
    """Calls the model and multiplies the fused LM head's per-token log-probs by `weights`.

    `SFTTrainer.compute_loss` reduces Σ(−log_probs) / N and logs entropy, token accuracy and token counts from the
    same outputs; handed log-probs already multiplied by W·N/D it returns Σ W·ℓ / D and keeps every TRL metric.
    On the way it keeps Σ M·ℓ (detached), the numerator of the unweighted loss, with M = `token_mass`.

    TRL 1.14 (`kinfolk.compat.trl.FUSED_KERNELS` false) calls the model without the fused head and takes the
    model's own loss, its metrics from the logits: there the call's loss becomes Σ W·(N/D)·ℓ / N itself (`count`
    is N), with the log-probs from the logits and the model's MoE auxiliary loss added as the model adds it.
    """

    def __init__(self, model: torch.nn.Module, weights: torch.Tensor, token_mass: torch.Tensor, count: torch.Tensor):
        self.model = model
        self.weights = weights
        self.token_mass = token_mass
        self.count = count
        self.unweighted_nll_sum: torch.Tensor | None = None

    def __call__(self, *args, **kwargs):
        if not FUSED_KERNELS and "labels" in kwargs:
            return self._weighted_model_loss(*args, **kwargs)
        outputs = self.model(*args, **kwargs)
        if kwargs.get("fused_lm_head"):
            self.unweighted_nll_sum = -(outputs.log_probs.detach() * self.token_mass).sum()
            outputs.log_probs = outputs.log_probs * self.weights
        return outputs

    def _weighted_model_loss(self, *args, labels: torch.Tensor, num_items_in_batch=None, **kwargs):
        outputs = self.model(*args, **kwargs)  # without labels: the model computes no loss of its own
        log_probs, mask = label_log_probs_from_logits(outputs.logits, labels)
        for name, value in chunked_nll_metrics(outputs.logits, labels, mask).items():
            outputs[name] = value  # what TRL 1.14's loss_type="chunked_nll" (its default) reads its metrics from
        self.unweighted_nll_sum = -(log_probs.detach() * self.token_mass).sum()
        loss = -(log_probs * self.weights).sum() / self.count.clamp(min=1)
        if kwargs.get("output_router_logits") and getattr(outputs, "aux_loss", None) is not None:
            config = self.model.config.get_text_config()
            loss = loss + getattr(config, "router_aux_loss_coef", 0.0) * outputs.aux_loss.to(loss.device)
        outputs["loss"] = loss
        return outputs


class _WeightMetrics:
    """Running weight statistics between two log lines, fed with `weight_stats` gathered from every rank."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.examples, self.weight_sum = 0.0, 0.0
        self.minimum, self.maximum = math.inf, -math.inf
        self.batch_ess: list[float] = []

    def update(self, gathered: torch.Tensor) -> None:
        rows = gathered.tolist()  # one (len(STAT_NAMES),) row per rank; one device sync
        examples = sum(row[STAT["examples"]] for row in rows)
        if examples == 0:
            return
        weight_sum = sum(row[STAT["weight_sum"]] for row in rows)
        square_sum = sum(row[STAT["weight_square_sum"]] for row in rows)
        self.examples += examples
        self.weight_sum += weight_sum
        self.minimum = min(self.minimum, *(row[STAT["weight_min"]] for row in rows))
        self.maximum = max(self.maximum, *(row[STAT["weight_max"]] for row in rows))
        self.batch_ess.append(weight_sum**2 / square_sum if square_sum > 0 else 0.0)

    def summary(self) -> dict[str, float]:
        if not self.examples:
            return {}
        return {
            "weight/mean": self.weight_sum / self.examples,
            "weight/min": self.minimum,
            "weight/max": self.maximum,
            "weight/batch_ess": sum(self.batch_ess) / len(self.batch_ess),
        }


def _weighted_config(args: TrainingArguments | None, model: Any) -> WeightedSFTConfig:
    """`args` as a `WeightedSFTConfig` (defaults for the weight options), as SFTTrainer upgrades TrainingArguments."""
    if isinstance(args, WeightedSFTConfig):
        return args
    if args is None:
        name = model if isinstance(model, str) else model.config.name_or_path or type(model).__name__
        return WeightedSFTConfig(f"{str(name).split('/')[-1]}-WeightedSFT")
    values = args.to_dict()
    # to_dict masks every `*_token` field (hub_token, eos_token, pad_token): take the real values back
    values.update({key: getattr(args, key) for key in values if key.endswith("_token")})
    return WeightedSFTConfig(**values)


def _retained_source(args: WeightedSFTConfig, retained_dataset: Dataset | None) -> Dataset | None:
    if retained_dataset is None and args.retained_dataset_name is not None:
        retained_dataset = load_data(args.retained_dataset_name, args.retained_dataset_split)
    if retained_dataset is None and (args.replay_ratio > 0 or args.output_kl_coef > 0):
        raise ValueError(
            "replay_ratio > 0 and output_kl_coef > 0 need retained data: pass `retained_dataset=` to the trainer "
            "or set `retained_dataset_name`"
        )
    return retained_dataset


def _reject_unsupported(args: WeightedSFTConfig, compute_loss_func: Any, data_collator: Any) -> None:
    reasons = []
    if compute_loss_func is not None:
        reasons.append("`compute_loss_func` replaces the loss with one that knows nothing of the weights")
    if args.label_smoothing_factor > 0:
        reasons.append("`label_smoothing_factor` > 0 computes the loss from full logits, without the weights")
    if args.use_liger_kernel and not FUSED_KERNELS:
        reasons.append(
            "`use_liger_kernel=True` on TRL < 1.15: liger's fused_linear_cross_entropy is not supported, since that "
            "TRL takes liger's loss, which knows nothing of the weights (TRL >= 1.15 keeps its fused LM head)"
        )
    if args.loss_type == "dft":
        reasons.append("`loss_type='dft'` rescales each token by its own probability; use 'nll'")
    if (args.dataset_kwargs or {}).get("skip_prepare_dataset"):
        reasons.append(
            "`dataset_kwargs={'skip_prepare_dataset': True}` skips the step that writes the weights on the tokens"
        )
    if data_collator is not None and not isinstance(data_collator, DataCollatorForLanguageModeling):
        reasons.append(
            f"a custom data collator ({type(data_collator).__name__}) gives no per-token weights; leave "
            "`data_collator` unset (or pass TRL's DataCollatorForLanguageModeling)"
        )
    if args.weight_reduction == "sequence" and args.packing and args.packing_strategy == "wrapped":
        reasons.append(
            "weight_reduction='sequence' counts examples, and packing_strategy='wrapped' cuts them without "
            "recording where they start; use packing_strategy='bfd'"
        )
    if reasons:
        raise ValueError("WeightedSFTTrainer cannot honour these options: " + "; ".join(reasons) + ".")


def _refuse_sequence_sharding(parallelism: Any) -> None:
    if parallelism is not None and (parallelism.cp_enabled or parallelism.sp_enabled):
        kind = "context" if parallelism.cp_enabled else "sequence"
        raise ValueError(
            f"WeightedSFTTrainer does not support {kind} parallelism (`parallelism_config`): it shards each batch "
            "along the sequence, and the per-token loss weights are not sharded with it."
        )


def _check_datasets(args: WeightedSFTConfig, formatted: bool, **datasets: Any) -> None:
    """Refuse a dataset without rows before SFTTrainer reads its first row (a bare StopIteration there), one
    without the columns of any SFT format (TRL's KeyError) unless a `formatting_func` builds the text, and a weight
    column that is missing or holds bad weights: all before SFTTrainer loads the model."""
    for name, dataset in datasets.items():
        for part, rows in dataset.items() if isinstance(dataset, dict) else [(None, dataset)]:
            if not isinstance(rows, Dataset):
                continue
            described = f"the {name} dataset" + (f" {part!r}" if part else "")
            if len(rows) == 0:
                raise EmptyDatasetError(f"{described} has no rows (columns {sorted(rows.column_names)})")
            if not formatted and "input_ids" not in rows.column_names:
                try:
                    dataset_type(rows.column_names, args.dataset_text_field)
                except DatasetFormatError as error:
                    raise DatasetFormatError(f"{described}: {error}") from None
            if args.weight_column is not None and (name == "train" or args.weight_eval_loss):
                # fitted again where the tokens get their weights (`_prepare_dataset`), after the model has loaded
                WeightTransform.fit(
                    rows, args.weight_column, args.weight_clip_min, args.weight_clip_max, args.normalize_weights, name
                )


class WeightedSFTTrainer(AtomicCheckpointsMixin, SFTTrainer):
    """`trl.SFTTrainer` whose loss weights each example by its dataset's `weight_column` (see module docstring).

    Takes the same arguments as `SFTTrainer`; `args` is a `WeightedSFTConfig` (an `SFTConfig` or
    `TrainingArguments` is upgraded with the weight options at their defaults).
    """

    _tag_names: ClassVar[list[str]] = ["trl", "sft", "kinfolk", "weighted-sft"]
    _name = "Weighted SFT"

    def __init__(
        self,
        model,
        args: WeightedSFTConfig | TrainingArguments | None = None,
        data_collator=None,
        train_dataset: Dataset | IterableDataset | None = None,
        eval_dataset=None,
        processing_class=None,
        compute_loss_func=None,
        retained_dataset: Dataset | None = None,
        **kwargs,
    ):
        args = _weighted_config(args, model)
        _reject_unsupported(args, compute_loss_func, data_collator)
        _refuse_sequence_sharding(args.parallelism_config)  # before accelerate sets up the mesh it needs
        _check_datasets(args, kwargs.get("formatting_func") is not None, train=train_dataset, eval=eval_dataset)
        self._retained_source = _retained_source(args, retained_dataset)  # read in SFTTrainer.__init__
        self._retained_prepared = None
        seed_adapter_init(args.seed)
        super().__init__(
            model,
            args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            **kwargs,
        )
        warn_if_fewer_processes(self.args.world_size)
        if self._skip_prepare_dataset:  # vision datasets are prepared on the fly, without weight columns
            raise ValueError("WeightedSFTTrainer supports text datasets only; this dataset holds images.")
        # an accelerate config file can enable it without `args.parallelism_config`
        _refuse_sequence_sharding(self.accelerator.parallelism_config)
        if args.prompt_loss_weight > 0 and not self.completion_only_loss and not args.assistant_only_loss:
            logger.warning(
                f"prompt_loss_weight={args.prompt_loss_weight} has no effect: SFTTrainer already trains on every "
                "token of this dataset (completion_only_loss and assistant_only_loss are off)."
            )
        self.data_collator = WeightedCollator(self.data_collator)
        self._weight_metrics = {"train": _WeightMetrics(), "eval": _WeightMetrics()}
        # Weight statistics only describe weights a dataset column gave.
        has_weights = args.weight_column is not None
        self._logs_weights = {"train": has_weights, "eval": has_weights and args.weight_eval_loss}
        self._step_normalizer: torch.Tensor | None = None
        self._step_token_mass: torch.Tensor | None = None
        self._step_unweighted_loss: torch.Tensor | None = None
        self._micro_step = 0
        self._output_kl = self._build_output_kl(args) if args.output_kl_coef > 0 else None

    def _build_output_kl(self, args: WeightedSFTConfig) -> OutputKL:
        check_output_kl_trainer(self)
        retained = self._retained_tokens(self.processing_class, args)
        if args.max_length is not None:
            with global_then_local_main_first():
                retained = self._truncate(retained, args, *self._map_kwargs(retained, args, "retained"))
        batch_size = args.output_kl_batch_size or args.per_device_train_batch_size
        return OutputKL(
            RetainedBatches(retained, batch_size, args.seed), self.data_collator.collator, args.output_kl_divergence
        )

    # ---- data -------------------------------------------------------------------------------------------------

    def _prepare_dataset(self, dataset, processing_class, args, packing, formatting_func, dataset_name):
        """TRL's preparation without truncation, packing or shuffling; then the weight columns (and, for training,
        the replayed examples); then truncation, packing and shuffling as TRL orders them, carrying the columns."""
        transform = None
        if args.weight_column is not None and (dataset_name == "train" or args.weight_eval_loss):
            transform = WeightTransform.fit(
                dataset,
                args.weight_column,
                args.weight_clip_min,
                args.weight_clip_max,
                args.normalize_weights,
                dataset_name,
            )
        dataset = self._tokenize_with_weights(
            dataset, processing_class, args, formatting_func, dataset_name, transform
        )
        if dataset_name == "train" and args.replay_ratio > 0:
            dataset = replay_mix(dataset, self._retained_tokens(processing_class, args), args.replay_ratio, args.seed)
        map_kwargs, described = self._map_kwargs(dataset, args, dataset_name)
        with global_then_local_main_first():
            if args.max_length is not None and not packing:
                dataset = self._truncate(dataset, args, map_kwargs, described)
            if packing:
                if args.max_length is None:
                    raise ValueError("When packing is enabled, `max_length` can't be `None`.")
                dataset = dataset.select_columns(["input_ids", "labels", *TOKEN_COLUMNS])
                if args.shuffle_dataset:
                    dataset = dataset.shuffle(seed=args.seed)
                dataset = pack_dataset(
                    dataset, args.max_length, args.packing_strategy, {**map_kwargs, **described("Packing")}
                )
        if args.shuffle_dataset:
            dataset = dataset.shuffle(seed=args.seed)
        return dataset

    @staticmethod
    def _map_kwargs(dataset, args, dataset_name: str):
        map_kwargs = {"num_proc": args.dataset_num_proc} if isinstance(dataset, Dataset) else {}
        described = (lambda text: {"desc": f"{text} {dataset_name} dataset"}) if map_kwargs else (lambda text: {})
        return map_kwargs, described

    def _tokenize_with_weights(
        self, dataset, processing_class, args, formatting_func, dataset_name, transform, weight: float = 1.0
    ):
        """TRL's tokenisation and labels, every row kept in order; then the per-token weight columns (`weight` for
        every example when there is no `transform`)."""
        unpacked = copy.copy(args)
        unpacked.max_length, unpacked.shuffle_dataset = None, False
        dataset = super()._prepare_dataset(dataset, processing_class, unpacked, False, formatting_func, dataset_name)
        map_kwargs, described = self._map_kwargs(dataset, args, dataset_name)
        with global_then_local_main_first():
            return dataset.map(
                token_weight_columns,
                with_indices=True,
                fn_kwargs={"transform": transform, "prompt_loss_weight": args.prompt_loss_weight, "weight": weight},
                **map_kwargs,
                **described("Writing example weights on the tokens of"),
            )

    def _retained_tokens(self, processing_class, args):
        """The retained data, tokenised once (replay and Output-KL share it), at weight `replay_weight`."""
        if self._retained_prepared is None:
            self._retained_prepared = self._tokenize_with_weights(
                self._retained_source, processing_class, args, None, "retained", None, args.replay_weight
            )
        return self._retained_prepared

    @staticmethod
    def _truncate(dataset, args, map_kwargs, described):
        if args.truncation_mode == "keep_start":
            kept = slice(None, args.max_length)
        elif args.truncation_mode == "keep_end":
            kept = slice(-args.max_length, None)
        else:
            raise ValueError(f"Unsupported truncation mode: {args.truncation_mode}, expected 'keep_start'")
        columns = ("input_ids", "labels", *TOKEN_COLUMNS)
        dataset = dataset.map(
            lambda example: {name: example[name][kept] for name in columns},
            **map_kwargs,
            **described("Truncating"),
        )
        # SFTTrainer drops examples that truncation left without a trained token; so do we (prompt tokens at a
        # reduced weight do not count: the example's answer is gone).
        return dataset.filter(has_completion_token, **map_kwargs, **described("Dropping answerless examples from"))

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        self._signature_columns = [*self._signature_columns, *TOKEN_COLUMNS]

    # ---- loss -------------------------------------------------------------------------------------------------

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        self._close_unweighted_step()
        self._micro_step = 0
        self._step_normalizer = self._step_token_mass = None
        if num_items_in_batch is not None and batch_samples:
            self._step_normalizer = self._global_normalizer(batch_samples, device)
            self._step_token_mass = self._step_total(batch_samples, "token_mass", device, across_ranks=True)
        return batch_samples, num_items_in_batch

    def _step_total(self, batch_samples: list[dict[str, Any]], stat: str, device, across_ranks: bool) -> torch.Tensor:
        """A `weight_stats` entry summed over every micro-batch of the step (and over the ranks)."""
        total = sum(batch[WEIGHT_STATS][STAT[stat]].to(device) for batch in batch_samples)
        if across_ranks and self.args.world_size > 1:
            total = self.accelerator.gather(total).sum()
        return total

    def _global_normalizer(self, batch_samples: list[dict[str, Any]], device) -> torch.Tensor:
        """The reduction's D over every micro-batch of the step, counted the way transformers counts N."""
        normalizer = self._step_total(
            batch_samples, NORMALIZER[self.args.weight_reduction], device, self.args.average_tokens_across_devices
        )
        return normalizer / (self.get_tp_size() * self.get_cp_size() * self.get_sp_size())

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        weights = inputs.pop(LOSS_WEIGHTS)[:, 1:]
        token_mass = inputs.pop(TOKEN_MASS)[:, 1:]
        stats = inputs.pop(WEIGHT_STATS)
        mode = "train" if self.model.training else "eval"
        if self._logs_weights[mode]:
            self._weight_metrics[mode].update(self.accelerator.gather(stats[None]))
        # SFTTrainer divides by N (the step's label count, or this batch's without one); W·N/D makes that Σ W·ℓ / D.
        in_step = num_items_in_batch is not None and self._step_normalizer is not None and mode == "train"
        if in_step:
            count, normalizer = num_items_in_batch, self._step_normalizer
        else:
            count = (inputs["labels"][:, 1:] != IGNORE_INDEX).sum()
            normalizer = stats[STAT[NORMALIZER[self.args.weight_reduction]]]
        count = torch.as_tensor(count, dtype=weights.dtype, device=weights.device)
        scale = torch.where(normalizer > 0, count / normalizer, torch.zeros_like(count))
        weighted_model = _WeightedLogProbs(model, weights * scale, token_mass, count)
        result = super().compute_loss(
            weighted_model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )
        self._record_unweighted_loss(
            weighted_model.unweighted_nll_sum, stats, mode, in_step and self._step_token_mass is not None
        )
        if self._output_kl is None or mode != "train":
            return result
        loss, outputs = result if return_outputs else (result, None)
        # Like TRL's MoE aux loss: a per-micro-batch mean, so spread over the accumulation steps when the loss is
        # already normalised for the whole step; DDP averages it over the ranks.
        steps = self.current_gradient_accumulation_steps if num_items_in_batch is not None else 1
        loss = loss + self.args.output_kl_coef * self._retained_kl(model) / steps
        return (loss, outputs) if return_outputs else loss

    def _record_unweighted_loss(self, nll_sum: torch.Tensor, stats: torch.Tensor, mode: str, in_step: bool) -> None:
        """Σ M·ℓ over every rank, divided by the step's Σ M in the training loop (one value per optimiser step, as
        `loss`), else by this batch's (one value per batch, as TRL's eval metrics)."""
        nll_sum = self.accelerator.gather(nll_sum[None]).sum()
        if in_step:
            share = nll_sum / self._step_token_mass.clamp(min=torch.finfo(nll_sum.dtype).tiny)
            previous = self._step_unweighted_loss
            self._step_unweighted_loss = share if previous is None else previous + share
            return
        mass = self.accelerator.gather(stats[STAT["token_mass"]][None]).sum()
        self._metrics[mode]["unweighted_loss"].append((nll_sum / mass).item() if mass > 0 else 0.0)

    def _close_unweighted_step(self) -> None:
        if self._step_unweighted_loss is not None:
            self._metrics["train"]["unweighted_loss"].append(self._step_unweighted_loss.item())
            self._step_unweighted_loss = None

    def _retained_kl(self, model) -> torch.Tensor:
        """Output-KL of this micro-batch's retained batch, whose index follows from the step, micro-batch and rank."""
        micro_batches = self.state.global_step * self.args.gradient_accumulation_steps + self._micro_step
        self._micro_step += 1
        index = micro_batches * self.accelerator.num_processes + self.accelerator.process_index
        kl = self._output_kl(self.accelerator.unwrap_model(model), index, self._prepare_inputs)
        self._metrics["train"]["output_kl"].append(self.accelerator.gather(kl.detach()[None]).mean().item())
        return kl

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        if mode == "train":  # the step just taken is complete: its unweighted loss joins the average
            self._close_unweighted_step()
        prefix = "eval_" if mode == "eval" else ""
        logs.update({prefix + key: value for key, value in self._weight_metrics[mode].summary().items()})
        self._weight_metrics[mode].reset()
        super().log(logs, start_time)
