"""Where a Ray Train worker's batches come from.

- :class:`ShardBatches`: this rank's Ray Data shard of the training set (data and expert parallelism);
- :class:`MeshBatches`: under model parallelism tensor- and pipeline-parallel ranks must see
  identical batches, which Ray Data's per-worker split cannot give, so every worker holds the whole
  (small) dataset as tensors and draws each step's global batch from one seeded permutation
  (:class:`ReplicatedBatches`); data rank ``r`` of ``n`` takes rows ``[r * b, (r + 1) * b)`` of it.
  One process with ``n = 1`` and batch ``n * b`` sees the same rows.

Step-level checkpoints (``run.checkpoint_every_steps``) need the same: a resumed run continues
with the next unseen batch only if every step's rows are a function of (seed, epoch, step). Ray
Data's streaming split hands blocks to whichever rank asks first and keeps no position to resume
from, so data-parallel runs with step checkpoints read :class:`MeshBatches` too (the sampler
PyTorch's ``DistributedSampler`` implements, resumed by skipping whole steps).
"""

import math
from collections.abc import Iterator
from typing import Optional

import torch

from scaleforge.distributed.strategy import Batch

_EVAL_ROWS = 256
"""Rows of a test forward pass per rank: a language model's logits are rows x tokens x vocabulary
(256 x 128 x 256 floats, 32 MiB, at train_lm_small.yaml's shapes); at 1,024 rows scoring is
memory-bound, about 30% slower on that config's validation windows."""


class ShardBatches:
    """Seeded, locally shuffled batches of this rank's Ray Data shard of the training set.

    The test set is not split by Ray Data, whose equal split drops up to ``world - 1`` rows: every
    rank reads it whole, in order, and evaluates rows ``rank, rank + world, ...`` of each batch, so
    the ranks together score every row once, in the same number of (collective) forward passes.
    """

    def __init__(
        self,
        batch_size: int,
        seed: int,
        num_train: int,
        rank: int,
        world: int,
        columns: dict[str, torch.dtype],
    ):
        self.batch_size, self.seed, self.rank, self.world = batch_size, seed, rank, world
        self.dtypes = dict(columns)
        self.train_shard, self.test_shard = _shard("train"), _shard("test")
        self.steps_per_epoch = math.ceil((num_train // world) / batch_size)
        self.eval_rows = _EVAL_ROWS

    def train(self, epoch: int, start: int = 0) -> Iterator[list[Batch]]:
        if start:
            raise ValueError("a Ray Data shard has no position to resume from; use ordered batches")
        batches = self.train_shard.iter_torch_batches(
            batch_size=self.batch_size,
            dtypes=self.dtypes,
            device=_device(),
            local_shuffle_buffer_size=4096,
            local_shuffle_seed=self.seed + epoch,
        )
        for batch in batches:
            yield [Batch(batch.pop("x"), batch.pop("y"), batch)]

    def test(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = self.test_shard.iter_torch_batches(
            batch_size=self.eval_rows * self.world,
            device=_device(),
            dtypes={"x": self.dtypes["x"], "y": self.dtypes["y"]},
        )
        return (
            (batch["x"][self.rank :: self.world], batch["y"][self.rank :: self.world]) for batch in batches
        )


class ReplicatedBatches:
    """Seeded, shuffled global batches of ``slices`` slices of ``batch_size`` rows, shared out over the
    data ranks; the last incomplete one is dropped (pipeline shapes are fixed).

    Data rank ``r`` of ``data_world`` takes slices ``r, r + data_world, ...``: one each when
    ``slices == data_world`` (the default), several (gradient accumulation) when an elastic run has
    fewer workers than its global batch has slices, so the rows of every step stay the same.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        data_rank: int,
        data_world: int,
        seed: int,
        slices: Optional[int] = None,
    ):
        self.slices = slices or data_world
        if self.slices < data_world:
            raise ValueError(f"{data_world} data ranks cannot share a global batch of {self.slices} slices")
        if len(x) < batch_size * self.slices:
            raise ValueError(
                f"{len(x)} examples cannot fill one global batch of {batch_size} x {self.slices}"
            )
        self.x, self.y = x, y
        self.batch_size, self.data_rank, self.data_world, self.seed = batch_size, data_rank, data_world, seed

    def __len__(self) -> int:
        return len(self.x) // (self.batch_size * self.slices)

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's ``(x, y)`` for every step of ``epoch`` (its slices together)."""
        for step in self.rows(epoch):
            rows = torch.cat(step)
            yield self.x[rows], self.y[rows]

    def rows(self, epoch: int, start: int = 0) -> Iterator[list[torch.Tensor]]:
        """The row indices of this rank's slices at each step of ``epoch`` from step ``start`` on."""
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(self.seed + epoch))
        global_batch = self.batch_size * self.slices
        for step in range(start, len(self)):
            yield [
                order[step * global_batch + j * self.batch_size :][: self.batch_size]
                for j in range(self.data_rank, self.slices, self.data_world)
            ]


def data_slice(
    x: torch.Tensor, y: torch.Tensor, data_rank: int, data_world: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every ``data_world``-th example from ``data_rank``: this rank's share of the test set.

    The last ``len(x) % data_world`` examples are left out: every rank then runs the same number
    of forward passes, which are collective under FSDP.
    """
    usable = len(x) - len(x) % data_world
    return x[data_rank:usable:data_world], y[data_rank:usable:data_world]


class MeshBatches:
    """The whole dataset on every rank of a mesh, sliced by data rank (see the module docstring)."""

    def __init__(
        self,
        batch_size: int,
        seed: int,
        data_rank: int,
        data_world: int,
        dtypes: dict[str, torch.dtype],
        fixed_shapes: bool,
        slices: Optional[int] = None,
    ):
        train = _tensors(_shard("train"), dtypes)
        x, y = train.pop("x"), train.pop("y")
        self.extras = train
        """The hooks' columns (a teacher's logits), indexed like ``x``."""
        self.replicated = ReplicatedBatches(x, y, batch_size, data_rank, data_world, seed, slices)
        test = _tensors(_shard("test"), {"x": dtypes["x"], "y": dtypes["y"]})
        self.test_x, self.test_y = data_slice(test["x"], test["y"], data_rank, data_world)
        self.steps_per_epoch = len(self.replicated)
        self.eval_rows = batch_size if fixed_shapes else _EVAL_ROWS

    def train(self, epoch: int, start: int = 0) -> Iterator[list[Batch]]:
        """This rank's slices of every step of ``epoch`` from step ``start`` on (a resumed run's next
        unseen one)."""
        x, y = self.replicated.x, self.replicated.y
        for step in self.replicated.rows(epoch, start):
            yield [
                Batch(x[rows], y[rows], {name: column[rows] for name, column in self.extras.items()})
                for rows in step
            ]

    def test(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return zip(self.test_x.split(self.eval_rows), self.test_y.split(self.eval_rows))


def _tensors(shard, dtypes: dict[str, torch.dtype]) -> dict[str, torch.Tensor]:
    """The columns ``dtypes`` names of a whole (unsplit) Ray Data iterator, as tensors on this rank's
    device."""
    batches = list(shard.iter_torch_batches(batch_size=8192, dtypes=dtypes, device=_device()))
    return {name: torch.cat([b[name] for b in batches]) for name in dtypes}


def ordered_data_config():
    """Ray Train's ingest for :class:`MeshBatches`: every worker reads the whole dataset in one fixed
    order."""
    from ray.data import DataContext, ExecutionOptions  # Ray only where Ray Train asks: gloo unit tests
    from ray.train import DataConfig  # import this module in processes of their own (1.5 s of CPU less)

    # DataConfig.default_ingest_options() would copy exclude_resources, whose setter prints Ray's own
    # deprecation warning on the job's console; the other defaults are DataContext's, as there.
    defaults = DataContext.get_current().execution_options
    options = ExecutionOptions(
        resource_limits=defaults.resource_limits,
        preserve_order=True,
        verbose_progress=defaults.verbose_progress,
    )
    return DataConfig(datasets_to_split=[], execution_options=options)


# Ray Train's calls, imported where a Ray Train worker makes them: the strategies' gloo unit tests import
# this module in processes of their own, where importing Ray Train costs 1.5 s of CPU each.
def _shard(name: str):
    import ray.train

    return ray.train.get_dataset_shard(name)


def _device() -> torch.device:
    import ray.train.torch

    return ray.train.torch.get_device()
