"""Ending a multi-process run cleanly: every rank reaches the end, then the default process group is destroyed.

A process that exits with its process group still alive leaves the teardown of gloo's (or NCCL's) threads and of
the rendezvous store to the interpreter's last moments, in whatever order they happen. When the rank that hosts the
store exits first, another rank can die in that teardown (`terminate called without an active exception`) after
all its work was done, and the launcher then kills the rest: a finished run reported as failed. Waiting at a
barrier and destroying the group before returning ends every rank the same way. Every process kinfolk launches
calls `end_process_group()` when its work succeeded (`kinfolk.commands.run` does it for every verb); a script of
your own that trains under `accelerate launch` can call it last, as `examples/sft_weighted.py` does.

>>> end_process_group()  # no process group in this process: nothing to do
False
"""

from __future__ import annotations

import sys


def end_process_group() -> bool:
    """Barrier, then destroy the default process group if one is initialised; True when there was one.

    Call it only after the run succeeded: a barrier waits for every rank, and after a failure another rank may never
    come (the launcher ends the others then)."""
    if "torch.distributed" not in sys.modules:  # nothing started one, and importing torch would cost seconds
        return False
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.barrier()
    dist.destroy_process_group()
    return True
