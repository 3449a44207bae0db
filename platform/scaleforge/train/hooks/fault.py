"""Fault injection: a worker dies mid-epoch, to prove that the run resumes from its checkpoint."""

import os
from dataclasses import dataclass
from typing import Optional

import ray.train
from ray.train import CheckpointConsistencyMode

from scaleforge.train.hooks.base import TrainHook, WorkerContext


@dataclass
class KillWorker(TrainHook):
    """The last rank exits (``os._exit(1)``) halfway through ``epoch`` (1-based) or, given ``step``,
    before that (1-based) optimiser step; on the first attempt only."""

    epoch: Optional[int] = None
    step: Optional[int] = None

    def fires(self, ctx: WorkerContext, epoch: int, step: int) -> bool:
        """Whether this rank dies before this step (``step``: within the epoch, 0-based)."""
        if ctx.rank != ctx.world - 1:
            return False
        if self.step is not None:
            return ctx.step + 1 == self.step and not ctx.start_step
        return (epoch + 1, step) == (self.epoch, ctx.steps_per_epoch // 2) and not ctx.start_epoch

    def on_step(self, ctx: WorkerContext, epoch: int, step: int) -> None:
        if not self.fires(ctx, epoch, step):
            return
        # Ray Train commits a reported checkpoint when its controller next polls the workers;
        # wait for that so the crash always lands after a durable checkpoint.
        ray.train.get_all_reported_checkpoints(CheckpointConsistencyMode.COMMITTED, timeout_s=60)
        ctx.progress.send(
            f"[fault] rank {ctx.rank} exits before step {ctx.step + 1} in epoch {epoch + 1} "
            f"({'fault.kill_worker_at_step' if self.step else 'fault.kill_worker_at_epoch'})",
            wait=True,
        )
        os._exit(1)
