"""Sharded models (FSDP2, DeepSpeed ZeRO-3) and code that runs a model's parts outside its forward.

FSDP2 (`torch.distributed.fsdp.fully_shard`) gathers a module's own parameters only inside that module's forward.
kinfolk's divergence code runs the backbone and reads the output head without calling the root model's forward,
so under FSDP2 the root's own parameters (embeddings, final norm, head: everything not in a sharded decoder layer)
would still be DTensor shards there. `unsharded_root` gathers them for the block and frees them after; the
decoder layers still gather their own in their forward. Meant for measurements under `torch.no_grad()`: the freed
parameters would be missing in a later backward. (It reaches into FSDP2's private `_lazy_init`, in this one place.)

ZeRO-3 keeps a partition of every parameter on each rank (a tensor of shape [0] in the module) and gathers a
module's parameters in hooks around that module's forward. A measurement that reads the head outside those forwards
gathers it for the read (`gathered_for_reading`); a loss that trains through it that way is refused under ZeRO-3
with one line (`refuse_under_sharding`), as the GPU checks found such paths failing (docs/distributed.md).

>>> import torch
>>> with unsharded_root(torch.nn.Linear(2, 2)):  # not sharded: nothing to do
...     pass
>>> zero3_partitioned(torch.nn.Linear(2, 2))
False
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from kinfolk.errors import InputError


def zero_stage(trainer) -> int | None:
    """The trainer's DeepSpeed ZeRO stage, None without DeepSpeed. Before a trainer exists (`trainer` None): 3 while
    transformers holds a live ZeRO-3 config (the arguments' `deepspeed`; models then load partitioned), else None."""
    if trainer is None:
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

        return 3 if is_deepspeed_zero3_enabled() else None
    plugin = getattr(getattr(getattr(trainer, "accelerator", None), "state", None), "deepspeed_plugin", None)
    return getattr(plugin, "zero_stage", None)


def partitioned_by_zero3(parameter: nn.Parameter) -> bool:
    """Whether ZeRO-3 has partitioned the parameter (DeepSpeed marks each one it does with a `ds_id`)."""
    return hasattr(parameter, "ds_id")


def zero3_partitioned(module: nn.Module) -> bool:
    """Whether ZeRO-3 has partitioned any of the module's parameters."""
    return any(partitioned_by_zero3(parameter) for parameter in module.parameters())


@contextlib.contextmanager
def gathered_for_reading(*tensors: torch.Tensor | None) -> Iterator[None]:
    """The ZeRO-3-partitioned parameters among `tensors` gathered whole for the block, for reading outside their
    module's forward (a measurement); anything else passes through: None, a plain tensor (a head's frozen copy) and
    every tensor outside ZeRO-3. TRL's `maybe_gather_lm_head_ctx` gathers, given only DeepSpeed's parameters (it reads
    their `ds_status`, which a plain tensor lacks). No gradient reaches the partitions through the gathered copies."""
    partitioned = [tensor for tensor in tensors if tensor is not None and partitioned_by_zero3(tensor)]
    if not partitioned:
        yield
        return
    from trl.trainer.utils import maybe_gather_lm_head_ctx

    with maybe_gather_lm_head_ctx(*partitioned):
        yield


def refuse_under_sharding(trainer, option: str, reason: str, *, under_fsdp: bool) -> None:
    """Raise a one-line InputError (a ValueError) for `option` when the trainer runs ZeRO-3 (or FSDP, with
    `under_fsdp`); `trainer` None: when the arguments configure ZeRO-3 (`zero_stage`), before anything loads."""
    if zero_stage(trainer) == 3:
        launcher = "DeepSpeed ZeRO-3"
    elif under_fsdp and getattr(trainer, "is_fsdp_enabled", False):
        launcher = "FSDP"
    else:
        return
    raise InputError(f"{option} is not supported under {launcher}: {reason} (use DDP or DeepSpeed ZeRO-2)")


# A loss that reads the head outside the model's forward. With the head gathered as a measurement gathers it
# (`gathered_for_reading`), Output-KL under ZeRO-3 on two CPU processes trained with gradients unlike DDP's
# (docs/distributed.md): such a loss is refused, a measurement (no gradient) gathers.
HEAD_OUTSIDE_FORWARD = "its loss reads the output head outside the model's forward, where only a shard of it is held"


@contextlib.contextmanager
def unsharded_root(model: nn.Module) -> Iterator[None]:
    """Gather an FSDP2 root module's own parameters for the block (a no-op for any other module)."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        yield
        return
    # FSDP2 decides which module is the root at the first forward and refuses a root forward after a layer has run
    # alone; a measurement before the first training step (on_train_begin) must settle the root first.
    model._get_fsdp_state()._lazy_init()
    model.unshard()
    try:
        yield
    finally:
        model.reshard()
