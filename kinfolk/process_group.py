"""Ending a multi-process run cleanly: every rank reaches the end, then the default process group is destroyed.

A process that exits with its process group still alive leaves the teardown of gloo's (or NCCL's) threads and of
the rendezvous store to the interpreter's last moments, in whatever order they happen. When the rank that hosts the
store exits first, another rank can die in that teardown (`terminate called without an active exception`) after
all its work was done, and the launcher then kills the rest: a finished run reported as failed. Waiting at a
barrier and destroying the group before returning ends every rank the same way. Every process kinfolk launches
calls `end_process_group()` when its work succeeded (`kinfolk.commands.run` does it for every verb); a script of
your own that trains under `accelerate launch` can call it last. `end_training(trainer)` is the same for a
`Trainer`: transformers' `Trainer.end()` (accelerate's `end_training`) destroys the group at once, and a rank that
gets there first shuts gloo down under a peer still saving; that peer then hung for good in DDP's reducer teardown
(seen in CI). So every rank waits for the others first, as `kinfolk sft`, `kinfolk distil` and
`examples/sft_weighted.py` do.

>>> end_process_group()  # no process group in this process: nothing to do
False
"""

from __future__ import annotations

import sys


def end_process_group() -> bool:
    """Barrier, then destroy the default process group if one is initialised; True when there was one.

    Call it only after the run succeeded: a barrier waits for every rank, and after a failure another rank may never
    come (the launcher ends the others then)."""
    if not _wait_for_every_rank():
        return False
    import torch.distributed as dist

    dist.destroy_process_group()
    return True


def end_training(trainer) -> None:
    """`trainer.end()` (trackers finished, process group destroyed) once every rank has reached this point, after
    dropping the trainer's DDP wrapper: its reducer must go while the group is alive, because a reducer freed after
    the group is destroyed joins gloo threads that never finish (seen in CI, py-spy in `~ProcessGroupGloo`)."""
    import gc

    trainer.accelerator.free_memory()
    trainer.model_wrapped = trainer.model
    gc.collect()
    _wait_for_every_rank()
    trainer.end()


def _wait_for_every_rank() -> bool:
    """A barrier over the default process group, if one is initialised; True when there was one."""
    if "torch.distributed" not in sys.modules:  # nothing started one, and importing torch would cost seconds
        return False
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.barrier()
    return True
