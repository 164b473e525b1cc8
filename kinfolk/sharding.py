"""FSDP2 and code that runs a model's parts outside its forward.

FSDP2 (`torch.distributed.fsdp.fully_shard`) gathers a module's own parameters only inside that module's forward.
kinfolk's divergence code runs the backbone and reads the output head without calling the root model's forward,
so under FSDP2 the root's own parameters (embeddings, final norm, head: everything not in a sharded decoder layer)
would still be DTensor shards there. `unsharded_root` gathers them for the block and frees them after; the
decoder layers still gather their own in their forward. Meant for measurements under `torch.no_grad()`: the freed
parameters would be missing in a later backward. (It reaches into FSDP2's private `_lazy_init`, in this one place.)

>>> import torch
>>> with unsharded_root(torch.nn.Linear(2, 2)):  # not sharded: nothing to do
...     pass
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


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
