"""a. Push and pull throughput: ours (2 ``AsyncWorker`` actors on 1 or 2 ``ParameterShard`` actors) against
the documentation's server and driver loop on as many server actors (its design split over 2 servers where
ours has 2 shards), the forward and backward pass skipped on both sides.

Every construction of our actors (``ParameterShard``, ``AsyncWorker``) by the benchmark is in
:func:`our_throughput`; :func:`_timed_run` runs inside an ``AsyncWorker``."""

import statistics
import time
import uuid

import numpy as np
import ray
import torch
from peers.docs_paramserver import DataWorker, ParameterServer, set_random_grads

from paramserver_parts.common import WARMUP_SECONDS
from scaleforge.config.models import MLPSpec
from scaleforge.models import MODEL_SPEC, build_model
from scaleforge.paramserver.consistency import Async
from scaleforge.paramserver.layout import ParamLayout
from scaleforge.paramserver.shard import ParameterShard
from scaleforge.paramserver.specs import ReplicaSpec, ShardSpec
from scaleforge.paramserver.worker import AsyncWorker


def mlp(total: int) -> tuple[dict, int]:
    """An MLP spec of 4 equal Linear layers (width in, width out) with about ``total`` parameters."""
    width = int((total / 4) ** 0.5)
    return MLPSpec(hidden=[width] * 3).model_dump(mode="json"), width


def docs_throughput(
    model: dict, width: int, seconds: float, numpy_weights: bool = False, servers: int = 1
) -> float:
    """Updates/s of the documentation's asynchronous driver loop, 2 workers; on ``servers`` > 1, each
    server holds its group of the parameters, each worker's gradient goes to them as that many objects
    and its next ``compute_gradients`` loads every server's fresh weights."""
    ps = [
        ParameterServer.options(num_cpus=0.01).remote(
            model, width, width, 0, "sgd", 0.01, numpy_weights=numpy_weights, part=(i, servers)
        )
        for i in range(servers)
    ]
    x, y = np.zeros((64, width), np.float32), np.zeros(64, np.int64)
    workers = [
        DataWorker.options(num_cpus=1).remote(
            i, model, width, width, x, y, 64, i, precomputed=True, servers=servers
        )
        for i in range(2)
    ]

    def compute(worker, weights: list) -> list:  # the gradient as one object a server
        if servers == 1:  # as written
            return [worker.compute_gradients.remote(weights[0])]
        return list(worker.compute_gradients.options(num_returns=servers).remote(*weights))

    try:
        ray.get([w.ready.remote() for w in workers])
        current_weights = [server.get_weights.remote() for server in ps]
        ray.get(current_weights)
        gradients = {}
        for w in workers:
            refs = compute(w, current_weights)
            gradients[refs[0]] = (w, refs)

        def loop(until: float) -> int:
            nonlocal current_weights
            updates = 0
            while time.perf_counter() < until:
                ready, _ = ray.wait(list(gradients))
                worker, refs = gradients.pop(ready[0])
                current_weights = [server.apply_gradients.remote(*[g]) for server, g in zip(ps, refs)]
                refs = compute(worker, current_weights)
                gradients[refs[0]] = (worker, refs)
                updates += 1
            return updates

        loop(time.perf_counter() + WARMUP_SECONDS)
        start = time.perf_counter()
        updates = loop(start + seconds)
        ray.get(current_weights)  # the last update counted has been applied
        return updates / (time.perf_counter() - start)
    finally:
        for actor in [*ps, *workers]:
            ray.kill(actor)


def _timed_run(worker, seconds: float, warmup: float) -> tuple[int, float]:
    """Runs inside an ``AsyncWorker`` (``__ray_call__``): its own ``run`` one step at a time, with
    the forward and backward pass replaced by the precomputed ``.grad`` tensors. Returns (steps, s)."""
    set_random_grads(worker.model, worker.index)

    calls = []

    def precomputed_gradient(model, layout, x, y, out=None):
        calls.append(1)
        return layout.flatten(model, grads=True, out=out), 0.0  # the real gradient() after backward()

    # Ray ships the actor class by value: its ``run`` looks ``gradient`` up in globals of its own.
    run_globals = type(worker).__ray_actor_class__.run.__globals__
    assert "gradient" in run_globals, "AsyncWorker.run no longer calls gradient(): update this benchmark"
    run_globals["gradient"] = precomputed_gradient
    clock, until = 0, time.perf_counter() + warmup
    while time.perf_counter() < until:
        worker.run(1, first_clock=clock)
        clock += 1
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        worker.run(1, first_clock=clock)
        clock += 1
        steps += 1
    elapsed = time.perf_counter() - start
    assert len(calls) == clock, "AsyncWorker.run did not call the replaced gradient"
    return steps, elapsed


def our_throughput(model: dict, width: int, seconds: float, shards: int) -> float:
    """Updates/s of 2 ``AsyncWorker`` actors (pull, load, write gradient, push) on ``shards`` shards."""
    torch.manual_seed(0)
    layout = ParamLayout.of(build_model(MODEL_SPEC.validate_python(model), width, width))
    ranges = layout.shard_ranges(shards)
    token = uuid.uuid4().hex[:12]
    shards = [
        ParameterShard.options(num_cpus=0.01, max_concurrency=64).remote(
            i,
            np.zeros(b - a, np.float32),
            ShardSpec(Async(), num_workers=2, optimizer="sgd", lr=0.01, momentum=0.0, run_token=token),
        )
        for i, (a, b) in enumerate(ranges)
    ]
    x, y = np.zeros((64, width), np.float32), np.zeros(64, np.int64)
    workers = [
        AsyncWorker.options(num_cpus=1).remote(
            ReplicaSpec(
                index=i,
                model=model,
                input_dim=width,
                num_classes=width,
                x=x,
                y=y,
                batch_size=64,
                seed=i,
                shards=tuple(shards),
                ranges=tuple(ranges),
                run_token=token,
            )
        )
        for i in range(2)
    ]
    try:
        ray.get([w.ready.remote() for w in workers])
        runs = ray.get([w.__ray_call__.remote(_timed_run, seconds, WARMUP_SECONDS) for w in workers])
        return sum(steps / elapsed for steps, elapsed in runs)
    finally:
        ray.get([actor.close.remote() for actor in [*workers, *shards]])
        for actor in [*shards, *workers]:
            ray.kill(actor)


def memcpy_gbps() -> float:
    source, target = np.ones(64 << 20, dtype=np.float32), np.empty(64 << 20, dtype=np.float32)
    best = min(_timed(lambda: np.copyto(target, source)) for _ in range(5))
    return source.nbytes / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


SERVERS = (1, 2)
"""Server processes a side: ours on 1 and 2 shards, the documentation's design on 1 and 2 servers."""

HEADER = """\
   servers: server processes a side (ours: shards; docs: the documentation's server, on 2 its parameters
   split in 2 groups of layers, one a server actor, each worker pushing each group's gradient to its
   server and loading both servers' weights). docs: as written (weights returned as torch tensors);
   docs-np: the same with the weights returned as numpy arrays (a faster variant, for reference, 1
   server). GB/s = updates/s x parameters x 4 bytes x 2 (gradient in, parameters out). 2/1: ours on 2
   shards over docs on 1 server (the ratio the bar took before it compared equal server processes)"""
COLUMNS = "params servers docs_upd/s docs-np ours_upd/s ratio vs_np docs_GB/s ours_GB/s of_memcpy 2/1".split()
WIDTHS = (10, 7, 11, 8, 11, 6, 6, 10, 10, 10, 6)


def push_pull_table(seconds: float, sizes: tuple[int, ...], header: bool = True) -> dict[int, dict]:
    """Per size, the sides one after the other: the documentation's server (and its numpy variant) and
    ours on 1 server process each, then its design on 2 servers and ours on 2 shards."""
    bandwidth = memcpy_gbps()
    if header:
        print(
            f"a. Push + pull throughput, 2 workers, {seconds:g} s each side; memcpy bandwidth here "
            f"{bandwidth:.1f} GB/s.\n" + HEADER
        )
        print("   " + " ".join(f"{name.replace('_', ' '):>{width}s}" for name, width in zip(COLUMNS, WIDTHS)))
    results = {}
    for total in sizes:
        model, width = mlp(total)
        params = 4 * (width * width + width)
        result = {"params": params, "bandwidth": bandwidth}
        for servers in SERVERS:
            docs = docs_throughput(model, width, seconds, servers=servers)
            docs_np = docs_throughput(model, width, seconds, numpy_weights=True) if servers == 1 else None
            ours = our_throughput(model, width, seconds, shards=servers)
            moved = {side: rate * params * 4 * 2 / 1e9 for side, rate in (("docs", docs), ("ours", ours))}
            result[servers] = {"docs": docs, "docs_np": docs_np, "ours": ours, "ours_gbps": moved["ours"]}
            result[servers]["share"] = moved["ours"] / bandwidth
            old = f"{ours / result[1]['docs']:5.2f}x" if servers == 2 else "-"
            print(
                f"   {params:10,d} {servers:7d} {docs:11.1f} "
                + (f"{docs_np:8.1f}" if docs_np else f"{'-':>8s}")
                + f" {ours:11.1f} {ours / docs:5.2f}x "
                + (f"{ours / docs_np:5.2f}x" if docs_np else f"{'-':>6s}")
                + f" {moved['docs']:10.2f} {moved['ours']:10.2f} {moved['ours'] / bandwidth:9.0%} {old:>6s}",
                flush=True,
            )
        results[total] = result
    return results


def throughput(args) -> list:
    """The table at every size once, then more runs at 10M; each bar holds in every run."""
    results = push_pull_table(args.seconds, tuple(int(s) for s in args.sizes.split(",")))
    if 10_000_000 not in results:
        return []
    first = results[10_000_000]
    runs = [first] + [
        push_pull_table(args.seconds, (10_000_000,), header=False)[10_000_000] for _ in range(args.runs - 1)
    ]
    label = f"a. push + pull, {first['params'] / 1e6:.0f}M params, 2 workers"
    rows = []
    for servers in SERVERS:
        ratios = [r[servers]["ours"] / r[servers]["docs"] for r in runs]
        rows.append(
            (
                f"{label}: ours / docs, {servers} server{'s' * (servers > 1)} a side, {len(runs)} runs",
                f"{min(ratios):.2f}x-{max(ratios):.2f}x (median {statistics.median(ratios):.2f}x)",
                ">= 2.5x in every run",
                min(ratios) >= 2.5,
            )
        )
    moved = first[2]
    rows.append(
        (
            f"{label}: bytes moved, ours on 2 shards, of memcpy",
            f"{moved['ours_gbps']:.2f} GB/s = {moved['share']:.1%} of {first['bandwidth']:.1f} GB/s",
            ">= 25%",
            moved["share"] >= 0.25,
        )
    )
    return rows
