"""`LayerDistillationTrainer`: boomerang / ADAPT distillation of a layer-subset student from its frozen teacher.

Built on TRL's `SFTTrainer`, so data preparation, completion / assistant masks, packing, padding-free batches,
gradient accumulation and logging are the SFT trainer's own. On top of its cross-entropy (computed by TRL's fused
LM head) it adds, over the same trained tokens,

    kl_weight · T² · KL(teacher ‖ student)           next-token distributions, chunked over the vocabulary;
    cosine_weight · Σ_i (1 − cos(h_i, g_i))           h_i: output of student layer i, g_i: output of the last
                                                      teacher layer of block i (from the layer map).

Two phases, one schedule (ADAPT §3.2): the first `pretraining_fraction` (0.5) of the `max_steps` optimiser steps
draw from `pretraining_dataset`, whose every token is trained (CE, KL and block cosine at every position, prompt /
completion rows included), the rest from `train_dataset` (SFT data, response tokens only, as SFTTrainer masks them),
each phase passing over its rows as often as its steps need, under one continuous learning-rate schedule. Give only
`train_dataset` for a single phase. The teacher is frozen, in eval mode and never wrapped for gradients; with
both weights 0 it is not run at all (a cross-entropy baseline then costs what SFT costs, and logs no distill/*).

The name says what sets it apart from TRL's `DistillationTrainer`, which is on-policy (the student generates, then
matches the teacher's output distribution): this one is teacher-forced on the dataset's tokens and aligns the
student's layers with the teacher's blocks, the recipe that turns a layer-dropped student back into its teacher.

    trainer = LayerDistillationTrainer(
        model="students/base-init",            # from `kinfolk merge init-student`, holds adapt_layer_map.json
        teacher_model="Qwen/Qwen3-4B-Base",
        args=LayerDistillationConfig(output_dir="students/base-distilled"),
        pretraining_dataset=pile_sample,       # {"text": ...}
        train_dataset=sft_data,                # prompt / completion or messages
    )
    trainer.train()
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from datasets import Dataset, concatenate_datasets
from torch import nn
from torch.utils.data import Sampler
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel
from trl import SFTTrainer
from trl.models import prepare_deepspeed
from trl.trainer.utils import create_model_from_path

from kinfolk.divergence import OutputHead, chunked_divergence
from kinfolk.launch_check import warn_if_fewer_processes
from kinfolk.layout import base_model, decoder_layers, layout_from_config
from kinfolk.plugins.adapt.layer_map import LAYER_MAP_FILE, LayerMap
from kinfolk.sharding import HEAD_OUTSIDE_FORWARD, refuse_under_sharding
from kinfolk.trainers.atomic_checkpoints import AtomicCheckpointsMixin
from kinfolk.trainers.layer_distillation_config import LayerDistillationConfig


class LayerOutputs:
    """Records, during one forward pass, the outputs of chosen decoder layers and the final-norm output.

    A layer's output is read as the input of what comes next (the next layer, or the final norm for the last
    layer) through pre-hooks: those run outside gradient checkpointing's recomputed region, so the recorded
    tensors carry gradients whatever checkpointing mode is used. Only the first forward pass in a `record()`
    block is kept. `remove()` takes the hooks off again (for a model that is measured, then used on).
    """

    def __init__(self, model: nn.Module, layers: list[int]):
        base = base_model(model)
        layout = layout_from_config(base.config)
        modules = decoder_layers(base)
        final_norm = base.get_submodule(layout.final_norm)
        self.outputs: dict[Any, torch.Tensor] | None = None
        self._handles = []
        for layer in layers:
            following = modules[layer + 1] if layer + 1 < len(modules) else final_norm
            self._handles.append(following.register_forward_pre_hook(self._keep_input(layer), with_kwargs=True))
        self._handles.append(final_norm.register_forward_hook(self._keep_output("final")))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _keep(self, key: Any, tensor: torch.Tensor) -> None:
        if self.outputs is not None and key not in self.outputs:
            self.outputs[key] = tensor

    def _keep_input(self, key: Any):
        def hook(module, args, kwargs):
            self._keep(key, args[0] if args else kwargs["hidden_states"])

        return hook

    def _keep_output(self, key: Any):
        def hook(module, args, output):
            self._keep(key, output[0] if isinstance(output, tuple) else output)

        return hook

    @contextlib.contextmanager
    def record(self) -> Iterator[dict[Any, torch.Tensor]]:
        self.outputs = {}
        try:
            yield self.outputs
        finally:
            self.outputs = None


class PhaseSampler(Sampler[int]):
    """`counts[i]` rows of phase i, phase after phase: passes over the phase's `sizes[i]` rows, each pass in a fresh
    seeded order, cut at `counts[i]`. The same order on every rank (accelerate shards it into batches).

    >>> order = list(PhaseSampler(sizes=(3, 2), counts=(4, 2), seed=0))
    >>> sorted(order[:3]), order[3] in (0, 1, 2), sorted(order[4:])
    ([0, 1, 2], True, [3, 4])
    """

    def __init__(self, sizes: tuple[int, ...], counts: tuple[int, ...], seed: int, shuffle: bool = True):
        self.sizes, self.counts, self.seed, self.shuffle, self.epoch = tuple(sizes), tuple(counts), seed, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        offset = 0
        for size, count in zip(self.sizes, self.counts):
            drawn = 0
            while drawn < count:
                order = torch.randperm(size, generator=generator) if self.shuffle else torch.arange(size)
                order = order[: count - drawn]
                yield from (order + offset).tolist()
                drawn += len(order)
            offset += size

    def __len__(self) -> int:
        return sum(self.counts)


def phase_steps(max_steps: int, pretraining_fraction: float) -> tuple[int, int]:
    """Optimiser steps of the pre-training and the SFT phase (the first rounded half up).

    >>> phase_steps(5, 0.5), phase_steps(4, 0.25)
    ((3, 2), (1, 3))
    """
    pretraining = math.floor(max_steps * pretraining_fraction + 0.5)
    return pretraining, max_steps - pretraining


def distillation_kl(
    student_hidden: torch.Tensor,
    student: PreTrainedModel,
    teacher_hidden: torch.Tensor,
    teacher: PreTrainedModel,
    temperature: float,
) -> torch.Tensor:
    """Σ over rows of KL(teacher ‖ student) at temperature T, from final hidden states (N, H) and the LM heads,
    chunked over tokens and vocabulary (no (N, V) logits). Differentiable in the student only."""
    per_token = chunked_divergence(
        student_hidden,
        OutputHead.of(student),
        teacher_hidden.to(student_hidden.device),
        OutputHead.of(teacher),
        kind="forward_kl",
        temperature=temperature,
    )
    return per_token.sum()


def _config_of(teacher: str | PreTrainedModel, init_kwargs: dict[str, Any]) -> PretrainedConfig:
    """The teacher's config without loading its weights (for a teacher given by path)."""
    if not isinstance(teacher, str):
        return teacher.config
    return AutoConfig.from_pretrained(teacher, trust_remote_code=bool(init_kwargs.get("trust_remote_code", False)))


def resolve_layer_map(layer_map: LayerMap | str | Path | None, model: Any) -> LayerMap:
    """An explicit map, else the one saved in the student's directory."""
    if isinstance(layer_map, LayerMap):
        return layer_map
    if layer_map is not None:
        return LayerMap.load(layer_map)
    directory = model if isinstance(model, (str, Path)) else getattr(base_model(model), "name_or_path", None)
    found = LayerMap.find(directory) if directory and Path(directory).is_dir() else None
    if found is None:
        raise ValueError(
            f"no layer map: the student ({directory or type(model).__name__}) has no {LAYER_MAP_FILE}; pass "
            "args.layer_map (or layer_map=) with the map from `kinfolk merge init-student`"
        )
    return found


class LayerDistillationTrainer(AtomicCheckpointsMixin, SFTTrainer):
    """SFTTrainer + frozen teacher: CE + λ_KL·T²·KL + λ_cos·Σ(1 − cos), optionally after a pre-training phase."""

    _tag_names: ClassVar[list[str]] = ["trl", "sft", "kinfolk", "distillation"]

    def __init__(
        self,
        model: str | PreTrainedModel,
        teacher_model: str | PreTrainedModel,
        args: LayerDistillationConfig | None = None,
        train_dataset: Dataset | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        processing_class=None,
        pretraining_dataset: Dataset | None = None,
        layer_map: LayerMap | str | None = None,
        **kwargs,
    ):
        if args is None:
            name = model if isinstance(model, str) else model.config.name_or_path
            args = LayerDistillationConfig(f"{Path(str(name)).name}-distilled")
        if kwargs.get("compute_loss_func") is not None:
            raise ValueError("LayerDistillationTrainer computes its own loss; compute_loss_func is not supported")
        if args.kl_weight:  # from the arguments, before the student loads (minutes for a large one)
            refuse_under_sharding(None, "kl_weight > 0", HEAD_OUTSIDE_FORWARD, under_fsdp=False)
        self.layer_map = resolve_layer_map(layer_map or args.layer_map, model)
        super().__init__(
            model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
            processing_class=processing_class, **kwargs,
        )  # fmt: skip
        warn_if_fewer_processes(self.args.world_size)
        if args.kl_weight:  # again from the launcher: accelerate's config without zero3_init_flag sets no such flag
            refuse_under_sharding(self, "kl_weight > 0", HEAD_OUTSIDE_FORWARD, under_fsdp=False)
        self._phase_sizes = self._add_pretraining_phase(pretraining_dataset)

        student_layers = self.layer_map.num_student_layers
        self.cosine_weight = args.cosine_weight if args.cosine_weight is not None else 10 / (student_layers + 1)
        # With both terms off the run is a cross-entropy baseline: the teacher would cost its memory and a forward
        # about what the student's costs, and change nothing (its terms enter the loss times zero), so it is neither
        # loaded nor run; its config still has to fit the layer map.
        self._uses_teacher = bool(args.kl_weight or self.cosine_weight)
        init_kwargs = dict(args.teacher_model_init_kwargs or {})
        if not self._uses_teacher:
            self._check_pair(base_model(self.model).config, _config_of(teacher_model, init_kwargs))
            self.teacher_model = None
            return
        if isinstance(teacher_model, str):
            if args.distributed_state.distributed_type in ("MULTI_GPU", "DEEPSPEED"):
                init_kwargs["device_map"] = None
            teacher_model = create_model_from_path(teacher_model, **init_kwargs)
        teacher_model.eval().requires_grad_(False)
        self._check_pair(base_model(self.model).config, teacher_model.config)
        self._student_outputs = LayerOutputs(self.model, list(range(student_layers)))
        self._teacher_outputs = LayerOutputs(teacher_model, self.layer_map.aligned_teacher_layers)
        if self.is_deepspeed_enabled:
            self.teacher_model = prepare_deepspeed(teacher_model, self.accelerator)
        else:
            self.teacher_model = self.accelerator.prepare_model(teacher_model, evaluation_mode=True)

    def _check_pair(self, student: PretrainedConfig, teacher: PretrainedConfig) -> None:
        student_layers = layout_from_config(student).num_layers
        teacher_layers = layout_from_config(teacher).num_layers
        if (student_layers, teacher_layers) != (self.layer_map.num_student_layers, self.layer_map.teacher_num_layers):
            raise ValueError(
                f"the layer map ({self.layer_map.describe()}) does not fit a {student_layers}-layer student and a "
                f"{teacher_layers}-layer teacher"
            )
        student_text, teacher_text = student.get_text_config(), teacher.get_text_config()
        for name in ("hidden_size", "vocab_size"):
            if getattr(student_text, name) != getattr(teacher_text, name):
                raise ValueError(
                    f"student and teacher differ in {name} ({getattr(student_text, name)} vs "
                    f"{getattr(teacher_text, name)}): layer alignment and the KL term need the same width and vocabulary"
                )

    def _add_pretraining_phase(self, pretraining_dataset: Dataset | None) -> tuple[int, ...]:
        """Prepare the pre-training rows as SFT data is prepared, train every one of their tokens, and put them
        before the SFT rows."""
        if pretraining_dataset is None:
            return (len(self.train_dataset),) if isinstance(self.train_dataset, Dataset) else ()
        if not isinstance(pretraining_dataset, Dataset) or not isinstance(self.train_dataset, Dataset):
            raise ValueError("two phases need map-style datasets (datasets.Dataset), not iterable ones")
        if self.args.max_steps <= 0:
            raise ValueError("two phases share the optimiser steps (pretraining_fraction of max_steps): set max_steps")
        prepared = self._prepare_dataset(
            pretraining_dataset, self.processing_class, self.args, self.args.packing, None, "pretraining"
        )
        # Phase 1 aligns every position (ADAPT §3.2): no prompt mask, whatever the rows' format.
        prepared = prepared.map(lambda row: {"labels": row["input_ids"]}, desc="Training every pre-training token")
        columns = [name for name in ("input_ids", "labels", "seq_lengths") if name in self.train_dataset.column_names]
        phases = [prepared.select_columns(columns), self.train_dataset.select_columns(columns)]
        if not all(len(phase) for phase in phases):
            raise ValueError(f"a phase has no rows (pre-training {len(phases[0])}, SFT {len(phases[1])})")
        self.train_dataset = concatenate_datasets(phases)
        return tuple(len(phase) for phase in phases)

    def _get_train_sampler(self, train_dataset=None):
        if len(self._phase_sizes) < 2:
            return super()._get_train_sampler(train_dataset)
        # The whole run is one pass of this sampler: max_steps global batches, the first ones from phase 1.
        batch = self.get_total_train_batch_size(self.args)
        steps = phase_steps(self.args.max_steps, self.args.pretraining_fraction)
        return PhaseSampler(self._phase_sizes, tuple(batch * count for count in steps), self.args.seed)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not self._uses_teacher:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        with self._student_outputs.record() as student:
            result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        loss, outputs = result if return_outputs else (result, None)
        loss = loss + self._distillation_terms(inputs, student, num_items_in_batch)
        return (loss, outputs) if return_outputs else loss

    def _teacher_outputs_for(self, inputs: dict[str, Any]) -> dict[Any, torch.Tensor]:
        teacher_inputs = {key: value for key, value in inputs.items() if key != "labels"}
        teacher_inputs.update(use_cache=False, logits_to_keep=1)  # the teacher's logits are never needed
        with torch.no_grad(), self._teacher_outputs.record() as teacher:
            self.teacher_model(**teacher_inputs)
        return teacher

    def _distillation_terms(self, inputs, student: dict, num_items_in_batch) -> torch.Tensor:
        """λ_KL·T²·KL + λ_cos·Σ(1 − cos), summed over the trained tokens and normalised like the CE term."""
        teacher = self._teacher_outputs_for(inputs)
        # Position t predicts label t + 1: the trained positions are those whose next label is not -100.
        mask = inputs["labels"][:, 1:] != -100
        tokens = mask.sum()

        def trained(hidden: torch.Tensor) -> torch.Tensor:
            return hidden[:, :-1][mask]

        cosine_sum = torch.zeros((), device=mask.device)
        for index, teacher_layer in enumerate(self.layer_map.aligned_teacher_layers):
            similarity = F.cosine_similarity(
                trained(student[index]).float(), trained(teacher[teacher_layer]).float(), dim=-1
            )
            cosine_sum = cosine_sum + (1 - similarity).sum()
        kl_sum = torch.zeros((), device=mask.device)
        if self.args.kl_weight:
            unwrapped_teacher = self.accelerator.unwrap_model(self.teacher_model)
            kl_sum = distillation_kl(
                trained(student["final"]), base_model(self.accelerator.unwrap_model(self.model)),
                trained(teacher["final"]), unwrapped_teacher, self.args.temperature,
            )  # fmt: skip
        temperature_scale = self.args.temperature**2
        total = self.args.kl_weight * temperature_scale * kl_sum + self.cosine_weight * cosine_sum
        # The same normalisation as SFTTrainer's cross-entropy, so gradient accumulation and DDP stay exact.
        denominator = tokens if num_items_in_batch is None else num_items_in_batch
        total = total / torch.as_tensor(denominator, device=total.device).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            total = total * (self.accelerator.num_processes // self.get_tp_size())
        self._log_terms(kl_sum, cosine_sum, tokens)
        return total

    def _log_terms(self, kl_sum: torch.Tensor, cosine_sum: torch.Tensor, tokens: torch.Tensor) -> None:
        mode = "train" if self.model.training else "eval"
        sums = torch.stack([kl_sum.detach().float(), cosine_sum.detach().float(), tokens.float()])
        kl, cosine, count = self.accelerator.gather_for_metrics(sums.unsqueeze(0)).sum(dim=0).tolist()
        if count > 0:
            self._metrics[mode]["distill/kl"].append(kl / count)
            # mean over tokens of the summed per-layer cosine distance, divided by M: the mean distance per layer
            self._metrics[mode]["distill/cosine_distance"].append(cosine / count / self.layer_map.num_student_layers)

    def _save(self, output_dir: str | None = None, state_dict=None):
        super()._save(output_dir, state_dict)
        # Later stages (delta, patch) check they were given a student of the same layer map.
        if self.args.should_save:
            self.layer_map.save(output_dir or self.args.output_dir)
