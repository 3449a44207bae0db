"""The actors of a parameter-server run and the cluster resources they hold: reserved together, started
from their specs, and given back together however the run ends."""

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from scaleforge.paramserver.outbox import remove_buffers
from scaleforge.paramserver.shard import ParameterShard
from scaleforge.paramserver.specs import ReplicaSpec, ShardSpec
from scaleforge.paramserver.worker import AsyncWorker


class Fleet:
    """One placement group for a run's first workers and its shards, and every actor it started.

    Args:
        num_workers: the workers at the start (one bundle of one CPU each).
        num_shards: shards mostly wait on pushes and pulls: a bundle of a sliver of CPU each.
        run_token: names the run's shared-memory files (removed on this node at the end).
    """

    def __init__(self, num_workers: int, num_shards: int, run_token: str):
        self.num_workers, self.run_token = num_workers, run_token
        # One bundle per actor, spread over nodes where the cluster has several.
        self.bundles = [{"CPU": 1}] * num_workers + [{"CPU": 0.01}] * num_shards
        self.group = None
        self.shards: list = []
        self.workers: list = []

    def reserve(self, timeout_s: float) -> None:
        """Reserve the bundles, or fail within ``timeout_s`` naming the CPUs the run needs and those free."""
        self.group = placement_group(self.bundles, strategy="SPREAD")
        try:
            ray.get(self.group.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            needed = sum(b["CPU"] for b in self.bundles)
            raise RuntimeError(
                f"the cluster could not place this run within run.placement_timeout_s={timeout_s:g} s: it "
                f"needs {needed:g} CPUs in {len(self.bundles)} bundles (one per worker and shard); free "
                f"now: {ray.available_resources().get('CPU', 0):g} of "
                f"{ray.cluster_resources().get('CPU', 0):g} CPUs"
            ) from None

    def start_shards(self, inits: list, spec: ShardSpec, die_at_update=None) -> list:
        """Shard ``i`` from ``inits[i]`` in its bundle; Ray restarts a shard whose process dies once
        (it restores its checkpoint) and retries the calls it was running. ``die_at_update``: shard 0's
        injected fault."""
        self.shards += [
            ParameterShard.options(
                num_cpus=0.01,
                max_concurrency=64,
                max_restarts=1,
                max_task_retries=-1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, self.num_workers + i),
            ).remote(i, init, spec, die_at_update=die_at_update if i == 0 else None)
            for i, init in enumerate(inits)
        ]
        return self.shards

    def start_worker(self, spec: ReplicaSpec):
        """Worker ``spec.index``, in its bundle if it is one of the first workers (a worker added by
        scaling runs outside the group); it replaces the worker of that index, if there was one."""
        placement = {}
        if spec.index < self.num_workers:
            placement["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self.group, spec.index)
        worker = AsyncWorker.options(num_cpus=1, **placement).remote(spec)
        if spec.index < len(self.workers):
            self.workers[spec.index] = worker
        else:
            self.workers.append(worker)
        return worker

    def close(self) -> None:
        """Close and kill every actor, give the placement group back, remove this node's shared buffers."""
        closing = [actor.close.remote() for actor in self.workers + self.shards]
        ray.wait(closing, num_returns=len(closing), timeout=10)
        for actor in self.shards + self.workers:
            ray.kill(actor, no_restart=True)
        if self.group is not None:
            remove_placement_group(self.group)
        remove_buffers(self.run_token)  # those of actors that died on this node
