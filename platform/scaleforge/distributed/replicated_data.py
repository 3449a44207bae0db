"""Batches for model-parallel training: the same rows on every rank that shares a data slice.

Tensor- and pipeline-parallel ranks must see identical batches, which Ray Data's per-worker
split cannot give. Each worker therefore holds the whole (small) dataset as tensors and draws
every step's global batch from one seeded permutation; data rank ``r`` of ``n`` takes rows
``[r * b, (r + 1) * b)`` of it. One process with ``n = 1`` and batch ``n * b`` sees the same rows.
"""

from collections.abc import Iterator

import torch


class ReplicatedBatches:
    """Seeded, shuffled global batches split by data rank; the last incomplete one is dropped
    (pipeline shapes are fixed)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, data_rank: int, data_world: int, seed: int):
        if len(x) < batch_size * data_world:
            raise ValueError(f"{len(x)} examples cannot fill one global batch of {batch_size} x {data_world}")
        self.x, self.y = x, y
        self.batch_size, self.data_rank, self.data_world, self.seed = batch_size, data_rank, data_world, seed

    def __len__(self) -> int:
        return len(self.x) // (self.batch_size * self.data_world)

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's ``(x, y)`` for every step of ``epoch``."""
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(self.seed + epoch))
        global_batch = self.batch_size * self.data_world
        for step in range(len(self)):
            start = step * global_batch + self.data_rank * self.batch_size
            rows = order[start:start + self.batch_size]
            yield self.x[rows], self.y[rows]


def data_slice(x: torch.Tensor, y: torch.Tensor, data_rank: int, data_world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every ``data_world``-th example from ``data_rank``: this rank's share of the test set.

    The last ``len(x) % data_world`` examples are left out: every rank then runs the same number
    of forward passes, which are collective under FSDP.
    """
    usable = len(x) - len(x) % data_world
    return x[data_rank:usable:data_world], y[data_rank:usable:data_world]
