"""The processes an atlas is fitted across: which rows are this rank's, and the sums the ranks pool.

`fit_atlas` runs under `torchrun` / `accelerate launch` as a trainer does: every process is given the same retained
data, takes its own share of the rows (`share`), and the k-means statistics are pooled with `all_reduce` (sums and
counts; the k-means sample is assembled from each rank's reservoir, never from all activations). Without an
initialised `torch.distributed` process group (or with one process) every operation is the identity.

>>> ranks = Ranks.current()
>>> ranks.world, ranks.share(list(range(5)))
(1, [0, 1, 2, 3, 4])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Ranks:
    """This process's rank among `world` processes of torch.distributed's default group; collectives run on
    `device` (the CPU for gloo, the current GPU for NCCL) and hand results back on the caller's device."""

    rank: int = 0
    world: int = 1
    device: str = "cpu"

    @classmethod
    def current(cls) -> Ranks:
        distributed = torch.distributed
        if not (distributed.is_available() and distributed.is_initialized() and distributed.get_world_size() > 1):
            return cls()
        device = f"cuda:{torch.cuda.current_device()}" if distributed.get_backend() == "nccl" else "cpu"
        return cls(distributed.get_rank(), distributed.get_world_size(), device)

    @property
    def many(self) -> bool:
        return self.world > 1

    def share(self, items: Sequence) -> Sequence:
        """This rank's contiguous slice of `items`: sizes differ by at most one, and a rank may get none."""
        return items[self.rank * len(items) // self.world : (self.rank + 1) * len(items) // self.world]

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum over ranks, on `tensor`'s device (`tensor` itself, untouched, with one process)."""
        return self._collective(tensor, torch.distributed.all_reduce)

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's `tensor` (same shape and dtype on every rank): bit-identical whatever each rank computed."""
        return self._collective(tensor, lambda moved: torch.distributed.broadcast(moved, src=0))

    def total(self, value: int) -> int:
        return int(self.sum(torch.tensor([value], dtype=torch.int64)).item())

    def each(self, value: int) -> list[int]:
        """`value` as every rank has it, in rank order."""
        mine = torch.zeros(self.world, dtype=torch.int64)
        mine[self.rank] = value
        return [int(count) for count in self.sum(mine).tolist()]

    def top_rows(self, rows: torch.Tensor, keys: torch.Tensor, size: int, width: int) -> torch.Tensor:
        """The (at most `size`) rows with the largest keys (in [0, 1)) among all ranks' `rows`, in decreasing key
        order, on every rank; `width` is the row length (a rank without rows does not know it). Several ranks only.

        Only keys travel in full (at most `size` per rank). Each rank then writes its own winners into a zero block
        and one sum assembles it, exactly: every slot has one writer.
        """
        mine = torch.zeros(self.world, size, dtype=torch.float64)
        mine[self.rank] = -1.0  # no key
        mine[self.rank, : keys.shape[0]] = keys.double().cpu()
        everyone = self.sum(mine).flatten()
        winners = everyone.topk(min(size, int((everyone >= 0).sum()))).indices
        owners, positions = winners // size, winners % size
        block = torch.zeros(winners.shape[0], width, dtype=torch.float32)
        ours = owners == self.rank
        if ours.any():
            block[ours] = rows[positions[ours].to(rows.device)].float().cpu()
        return self.sum(block).to(rows.device if rows.numel() else block.device)

    def _collective(self, tensor: torch.Tensor, operation) -> torch.Tensor:
        if not self.many:
            return tensor
        moved = tensor.to(self.device, copy=True)
        operation(moved)
        return moved.to(tensor.device)
