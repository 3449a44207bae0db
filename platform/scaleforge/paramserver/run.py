"""Drive a parameter-server run: start shards and workers, watch accuracy over wall-clock, export."""

import math
import time
import uuid
from typing import Optional

import numpy as np
import ray
import torch
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from scaleforge import storage
from scaleforge.artifacts import save_artifact
from scaleforge.config.async_sgd import AsyncSGDConfig
from scaleforge.data import localized
from scaleforge.data.in_memory import METRICS, InMemoryData, load_in_memory
from scaleforge.models import build_model
from scaleforge.paramserver.layout import InitialSlice, ParamLayout
from scaleforge.paramserver.outbox import remove_buffers
from scaleforge.paramserver.report import AsyncSGDResult, write_report
from scaleforge.paramserver.shard import ParameterShard
from scaleforge.paramserver.worker import AsyncWorker, StepDelays
from scaleforge.runtime import ensure_ray


def worker_shards(num_examples: int, num_workers: int, seed: int) -> list[np.ndarray]:
    """Each worker's example indices: a seeded permutation split evenly."""
    return np.array_split(np.random.default_rng(seed).permutation(num_examples), num_workers)


def run_async_sgd(cfg: AsyncSGDConfig) -> AsyncSGDResult:
    """Train ``cfg.model`` with SGD on parameter-server shards; export the model and a run summary."""
    server, workers_cfg = cfg.server, cfg.workers
    launched = time.perf_counter()
    ensure_ray(min_cpus=max([workers_cfg.num_workers] + [e.workers for e in workers_cfg.scaling]) + 1)
    data = load_in_memory(cfg.data)
    info = data.info
    torch.manual_seed(workers_cfg.seed)
    model = build_model(cfg.model, info.input_dim, info.num_classes)
    # One bundle per actor, spread over nodes where the cluster has several; shards mostly wait
    # on pushes and pulls, so they reserve a sliver of CPU, workers one CPU each.
    bundles = [{"CPU": 1}] * workers_cfg.num_workers + [{"CPU": 0.01}] * server.num_shards
    group = placement_group(bundles, strategy="SPREAD")
    shards, workers, run_token = [], [], uuid.uuid4().hex[:12]
    try:
        _wait_for_placement(group, bundles, cfg.run.placement_timeout_s)
        result = _train(cfg, group, data, model, shards, workers, launched, run_token)
    finally:  # whatever happened (an error, a timeout, Ctrl-C), give the cluster its resources back
        closing = [actor.close.remote() for actor in workers + shards]
        ray.wait(closing, num_returns=len(closing), timeout=10)
        for actor in shards + workers:
            ray.kill(actor, no_restart=True)
        remove_placement_group(group)
        remove_buffers(run_token)  # those of actors that died on this node
    return result


def _wait_for_placement(group, bundles: list[dict], timeout_s: float) -> None:
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        needed = sum(b["CPU"] for b in bundles)
        raise RuntimeError(
            f"the cluster could not place this run within run.placement_timeout_s={timeout_s:g} s: it needs "
            f"{needed:g} CPUs in {len(bundles)} bundles (one per worker and shard); free now: "
            f"{ray.available_resources().get('CPU', 0):g} of {ray.cluster_resources().get('CPU', 0):g} CPUs"
        ) from None


def _train(
    cfg: AsyncSGDConfig, group, data, model, shards: list, workers: list, launched: float, run_token: str
) -> AsyncSGDResult:
    """Start the shards and workers (appended to ``shards`` and ``workers``, so that the caller can
    always kill them), train until every worker is done, export the model and the report."""
    server, workers_cfg, info = cfg.server, cfg.workers, data.info
    layout = ParamLayout.of(model)
    ranges = layout.shard_ranges(server.num_shards)
    output = storage.normalize(cfg.run.output_dir)
    options = dict(
        optimizer=server.optimizer,
        lr=server.lr,
        momentum=server.momentum,
        mode=server.mode,
        num_workers=workers_cfg.num_workers,
        staleness_bound=server.staleness_bound,
        staleness_aware_lr=server.staleness_aware_lr,
        backup_workers=server.backup_workers,
        checkpoint_dir=storage.join(output, "checkpoints"),
        checkpoint_every=server.checkpoint_every,
    )
    initial_slices = [
        InitialSlice(
            cfg.model.model_dump(mode="json"), workers_cfg.seed, info.input_dim, info.num_classes, a, b
        )
        for a, b in ranges
    ]
    shards += [
        ParameterShard.options(
            num_cpus=0.01,
            max_concurrency=64,
            max_restarts=1,
            max_task_retries=-1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, workers_cfg.num_workers + i),
        ).remote(
            i,
            initial_slices[i],
            **options,
            die_at_update=cfg.fault.kill_shard_at_update if i == 0 else None,
            run_token=run_token,
        )
        for i in range(len(ranges))
    ]
    splits = worker_shards(len(data.y), workers_cfg.num_workers, workers_cfg.seed)
    steps = math.ceil(workers_cfg.epochs * min(len(s) for s in splits) / workers_cfg.batch_size)

    def start_worker(i: int, die_at_step=None):
        if i < len(splits):
            placement = {"scheduling_strategy": PlacementGroupSchedulingStrategy(group, i)}
            rows = splits[i]
        else:  # added by dynamic scaling: outside the group, a seeded sample of the training set
            placement = {}
            rows = np.random.default_rng(workers_cfg.seed + i).choice(
                len(data.y), len(splits[0]), replace=False
            )
        return AsyncWorker.options(num_cpus=1, **placement).remote(
            i,
            cfg.model.model_dump(mode="json"),
            info.input_dim,
            info.num_classes,
            data.x[rows],
            data.y[rows],
            workers_cfg.batch_size,
            workers_cfg.seed + i,
            shards,
            ranges,
            StepDelays(
                workers_cfg.straggler_delay_s if i == workers_cfg.num_workers - 1 else 0.0,
                workers_cfg.transient_delay_s,
                workers_cfg.transient_delay_probability,
                workers_cfg.seed + i,
            ),
            die_at_step,
            run_token,
            cfg.server.mode,
            workers_cfg.weight_prediction,
        )

    workers += [
        start_worker(i, cfg.fault.kill_worker_at_step if i == 0 else None)
        for i in range(workers_cfg.num_workers)
    ]
    # The clock starts once every worker is up: process start-up is not training time.
    ray.get([w.ready.remote() for w in workers])
    started = time.perf_counter()
    running = {w.run.remote(steps): i for i, w in enumerate(workers)}
    curve, reports, events, removed = [], [], [], set()
    starting: dict = {}  # ready() of each worker added by scaling, until its process is up: its index
    scaling = list(workers_cfg.scaling)
    while running:
        done, _ = ray.wait(list(running), num_returns=len(running), timeout=cfg.run.eval_every_s)
        for ref in done:
            index = running.pop(ref)
            try:
                reports.append(ray.get(ref))
            except ray.exceptions.RayActorError:  # the worker's process died: replace it, resume its clock
                if index in removed:
                    continue
                clock = min(ray.get([s.clock_of.remote(index) for s in shards]))
                events.append(
                    {
                        "seconds": time.perf_counter() - started,
                        "event": "worker_replaced",
                        "worker": index,
                        "at_step": clock,
                    }
                )
                print(f"[{server.mode}] worker {index} died at step {clock}; replaced, resuming", flush=True)
                workers[index] = start_worker(index)
                running[workers[index].run.remote(steps - clock, first_clock=clock)] = index
        # Scaling steps apply in order, each at (or after) its time and once the workers the one before
        # added are up.
        while scaling and scaling[0].at_s <= time.perf_counter() - started and running and not starting:
            target = scaling.pop(0).workers
            active = sorted(i for i in running.values() if i not in removed)  # killed ones may linger
            added = range(len(workers), len(workers) + max(0, target - len(active)))
            workers += [start_worker(index) for index in added]
            starting.update({workers[index].ready.remote(): index for index in added})
            for index in active[::-1][: max(0, len(active) - target)]:
                removed.add(index)
                ray.get([s.leave.remote(index) for s in shards])
                ray.kill(workers[index])
                events.append(
                    {"seconds": time.perf_counter() - started, "event": "worker_removed", "worker": index}
                )
            print(f"[{server.mode}] scaling to {target} workers ({len(active)} were training)", flush=True)
        # A worker joins once its process is up: a sync round or the SSP bound never waits on a
        # process that is still starting (the others train on meanwhile).
        up, _ = ray.wait(list(starting), num_returns=len(starting), timeout=0) if starting else ([], [])
        for ref in up:
            index = starting.pop(ref)
            clock = ray.get(shards[0].slowest_clock.remote())  # join level with the slowest
            ray.get([s.join.remote(index, clock) for s in shards])
            running[workers[index].run.remote(max(1, steps - clock), first_clock=clock)] = index
            events.append(
                {"seconds": time.perf_counter() - started, "event": "worker_added", "worker": index}
            )
        curve.append(_evaluate(shards, layout, model, data, time.perf_counter() - started))
        print(
            f"[{server.mode}] {curve[-1]['seconds']:6.1f}s  updates {curve[-1]['updates']:6d}  "
            f"{METRICS[data.metric]} {curve[-1][METRICS[data.metric]]:.4f}",
            flush=True,
        )
        stop = _stop_event(cfg, curve[-1]) if running else None
        if stop:
            events.append(stop)
            for index in running.values():
                ray.kill(workers[index])
            running.clear()
    wall = time.perf_counter() - started
    stats = ray.get([s.stats.remote() for s in shards])
    staleness = {kind: [v for s in stats for v in s["staleness"][kind]] for kind in ("clock", "updates")}
    result = AsyncSGDResult(
        server.mode,
        curve[-1][METRICS[data.metric]],
        stats[0]["version"],
        wall,
        staleness,
        curve,
        events=events + _shard_restarts(stats, reports),
        startup_s=started - launched,
        dropped=[s["dropped"] for s in stats],
        num_workers=workers_cfg.num_workers,
        metric=METRICS[data.metric],
    )
    result.artifact = save_artifact(
        cfg.artifact.dir,
        model,
        cfg.model,
        input_dim=info.input_dim,
        num_classes=info.num_classes,
        metrics={result.metric: result.score},
        dataset={"source": localized(cfg.data).source, "fingerprint": data.fingerprint},
        extra={
            "training": {
                "job": "async_sgd",
                "mode": server.mode,
                "num_shards": server.num_shards,
                "num_workers": workers_cfg.num_workers,
            }
        },
    )
    result.summary_path, result.plot_path = write_report(output, cfg, result)
    return result


def _stop_event(cfg: AsyncSGDConfig, point: dict) -> Optional[dict]:
    """The event that ends the run early at this measurement, if any: the target accuracy reached
    (``run.stop_at_accuracy``) or the time budget spent (``run.max_seconds``)."""
    if cfg.run.stop_at_accuracy and point["test_accuracy"] >= cfg.run.stop_at_accuracy:
        return {
            "seconds": point["seconds"],
            "event": "stopped_at_accuracy",
            "test_accuracy": point["test_accuracy"],
        }
    if cfg.run.max_seconds and point["seconds"] >= cfg.run.max_seconds:
        return {"seconds": point["seconds"], "event": "stopped_at_time", "updates": point["updates"]}
    return None


def _shard_restarts(stats: list[dict], reports: list[dict]) -> list[dict]:
    """For each restarted shard: the version it restored and the acknowledged updates it lost."""
    events = []
    for index, shard in enumerate(stats):
        if shard["incarnation"] == 0:
            continue
        acked_before = max((r["acked"][index].get(0, 0) for r in reports), default=0)
        events.append(
            {
                "event": "shard_restored",
                "shard": index,
                "restored_version": shard["restored_version"],
                "lost_updates": max(0, acked_before - shard["restored_version"]),
            }
        )
    return events


def _evaluate(shards, layout: ParamLayout, model, data: InMemoryData, seconds: float) -> dict[str, float]:
    snapshots = ray.get([s.snapshot.remote() for s in shards])
    layout.assign(model, np.concatenate([flat for flat, _ in snapshots]))
    return {
        "seconds": seconds,
        "updates": int(snapshots[0][1]),
        METRICS[data.metric]: held_out_score(model, data),
    }


def held_out_score(model: torch.nn.Module, data: InMemoryData) -> float:
    """Test accuracy, or a language model's validation bits per byte, on the full held-out set and on
    one thread: evaluation runs while workers train and must not take their cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return data.score(model)
    finally:
        torch.set_num_threads(threads)
