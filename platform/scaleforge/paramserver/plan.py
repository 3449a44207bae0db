"""What a parameter-server run is made of, computed once from its config and data before any actor
starts: the shards' ranges and spec, each worker's spec and data, the steps, when to stop."""

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import numpy as np

from scaleforge import storage
from scaleforge.config.async_sgd import AsyncSGDConfig
from scaleforge.data.in_memory import InMemoryData
from scaleforge.paramserver.consistency import Policy, consistency_of
from scaleforge.paramserver.layout import InitialSlice, ParamLayout
from scaleforge.paramserver.specs import ReplicaSpec, ShardSpec


def worker_shards(num_examples: int, num_workers: int, seed: int) -> list[np.ndarray]:
    """Each worker's example indices: a seeded permutation split evenly."""
    return np.array_split(np.random.default_rng(seed).permutation(num_examples), num_workers)


@dataclass(frozen=True)
class RunPlan:
    """One run's layout, consistency policy, data splits and steps; the actors' specs are built from it.
    (Its derived values are computed once, on first use.)"""

    cfg: AsyncSGDConfig
    data: InMemoryData
    layout: ParamLayout
    run_token: str

    @cached_property
    def ranges(self) -> list[tuple[int, int]]:
        """Each shard's [start, stop) in the flat parameter vector."""
        return self.layout.shard_ranges(self.cfg.server.num_shards)

    @cached_property
    def consistency(self) -> Policy:
        return consistency_of(self.cfg.server)

    @cached_property
    def splits(self) -> list[np.ndarray]:
        """The example indices of each of the first workers."""
        return worker_shards(len(self.data.y), self.cfg.workers.num_workers, self.cfg.workers.seed)

    @cached_property
    def steps(self) -> int:
        """Steps of each worker: ``workers.epochs`` passes over the smallest split."""
        workers = self.cfg.workers
        return math.ceil(workers.epochs * min(map(len, self.splits)) / workers.batch_size)

    @cached_property
    def output(self) -> str:
        return storage.normalize(self.cfg.run.output_dir)

    def initial_slices(self) -> list[InitialSlice]:
        """Each shard's initial parameters, described: the model rebuilt from the workers' seed."""
        cfg, info = self.cfg, self.data.info
        model, seed = cfg.model.model_dump(mode="json"), cfg.workers.seed
        return [InitialSlice(model, seed, info.input_dim, info.num_classes, a, b) for a, b in self.ranges]

    def shard_spec(self) -> ShardSpec:
        server = self.cfg.server
        return ShardSpec(
            consistency=self.consistency,
            num_workers=self.cfg.workers.num_workers,
            optimizer=server.optimizer,
            lr=server.lr,
            momentum=server.momentum,
            staleness_aware_lr=server.staleness_aware_lr,
            checkpoint_dir=storage.join(self.output, "checkpoints"),
            checkpoint_every=server.checkpoint_every,
            run_token=self.run_token,
            rounds=self.steps if self.consistency.in_rounds else None,
        )

    def replica_spec(self, index: int, shards: list, die_at_step: Optional[int] = None) -> ReplicaSpec:
        """Worker ``index``: one of the first workers trains on its split of the data, one added by
        scaling on a seeded sample of the training set. The last of the first workers straggles."""
        workers, info, splits = self.cfg.workers, self.data.info, self.splits
        if index < len(splits):
            rows = splits[index]
        else:
            rng = np.random.default_rng(workers.seed + index)
            rows = rng.choice(len(self.data.y), len(splits[0]), replace=False)
        return ReplicaSpec(
            index=index,
            model=self.cfg.model.model_dump(mode="json"),
            input_dim=info.input_dim,
            num_classes=info.num_classes,
            x=self.data.x[rows],
            y=self.data.y[rows],
            batch_size=workers.batch_size,
            seed=workers.seed + index,
            shards=tuple(shards),
            ranges=tuple(self.ranges),
            consistency=self.consistency,
            weight_prediction=workers.weight_prediction,
            delay_s=workers.straggler_delay_s if index == workers.num_workers - 1 else 0.0,
            transient_delay_s=workers.transient_delay_s,
            transient_delay_probability=workers.transient_delay_probability,
            die_at_step=die_at_step,
            run_token=self.run_token,
        )

    def stop_event(self, point: dict) -> Optional[dict]:
        """The event that ends the run early at this measurement, if any: the target accuracy reached
        (``run.stop_at_accuracy``) or the time budget spent (``run.max_seconds``)."""
        run = self.cfg.run
        if run.stop_at_accuracy and point["test_accuracy"] >= run.stop_at_accuracy:
            return {
                "seconds": point["seconds"],
                "event": "stopped_at_accuracy",
                "test_accuracy": point["test_accuracy"],
            }
        if run.max_seconds and point["seconds"] >= run.max_seconds:
            return {"seconds": point["seconds"], "event": "stopped_at_time", "updates": point["updates"]}
        return None
