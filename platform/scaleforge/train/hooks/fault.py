"""Fault injection: a worker dies mid-epoch, to prove that the run resumes from its checkpoint."""

import os
from dataclasses import dataclass

import ray.train
from ray.train import CheckpointConsistencyMode

from scaleforge.train.hooks.base import TrainHook, WorkerContext


@dataclass
class KillWorker(TrainHook):
    """The last rank exits (``os._exit(1)``) halfway through ``epoch`` (1-based), on the first attempt
    only."""

    epoch: int

    def fires(self, ctx: WorkerContext, epoch: int, step: int) -> bool:
        """Whether this rank dies before this step: the last rank, halfway through the epoch, first
        attempt."""
        return (
            (epoch + 1, step) == (self.epoch, ctx.steps_per_epoch // 2)
            and not ctx.start_epoch
            and ctx.rank == ctx.world - 1
        )

    def on_step(self, ctx: WorkerContext, epoch: int, step: int) -> None:
        if not self.fires(ctx, epoch, step):
            return
        # Ray Train commits a reported checkpoint when its controller next polls the workers;
        # wait for that so the crash always lands after a durable checkpoint.
        ray.train.get_all_reported_checkpoints(CheckpointConsistencyMode.COMMITTED, timeout_s=60)
        ctx.progress.send(
            f"[fault] rank {ctx.rank} exits in epoch {self.epoch} (fault.kill_worker_at_epoch)", wait=True
        )
        os._exit(1)
