"""Parameter server: ours against the one Ray's documentation builds, side by side in one run.

    .venv/bin/python bench/paramserver.py        (about 3 minutes on 2 cores)

a. Push throughput: 2 workers push a precomputed gradient (a fresh array each push, as a real
   worker makes a new gradient every step) for a fixed time; applied updates/s at 1M and 10M
   parameters. Baseline, as in Ray's parameter-server example: one ParameterServer actor;
   workers send lists of per-layer numpy gradients; the server sums them with ``np.stack``,
   steps a torch optimiser and returns the full weights on every call. Ours: the flat
   gradient split over 2 ``ParameterShard`` actors, each applying its slice in place and
   returning only its version; a worker writes each fresh gradient into its shared-memory
   buffer (``Outbox``) and a shard on its node reads its slice there, where the baseline's
   fresh arrays go through the object store. Gradient bytes/s is set against this machine's
   memcpy bandwidth.
b. Time to 0.90 test accuracy on MNIST-1D for sync, async and ssp with one of 3 workers
   4x slower than the others, from the moment every worker is up; each run stops at the target.
c. (``--parts c``, about 4 minutes) part b at three learning rates, and each mode at its best.
"""

import argparse
import contextlib
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import ray
import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "platform"), str(Path(__file__).resolve().parents[1])]

from scaleforge.config import AsyncSGDConfig, load_config  # noqa: E402
from scaleforge.paramserver import run_async_sgd  # noqa: E402
from scaleforge.paramserver.layout import ParamLayout  # noqa: E402
from scaleforge.paramserver.outbox import Outbox  # noqa: E402
from scaleforge.paramserver.preflight import check_runnable  # noqa: E402
from scaleforge.paramserver.shard import ParameterShard  # noqa: E402

PUSH_SECONDS = 6.0
WARMUP_SECONDS = 1.5


def layer_model(total: int) -> torch.nn.Module:
    """Four equal Linear layers with about ``total`` parameters."""
    width = int((total / 4) ** 0.5)
    return torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(4)))


@ray.remote
class ParameterServer:
    """The baseline, written the way Ray's documentation example writes it."""

    def __init__(self, shapes):
        self.params = [torch.nn.Parameter(torch.zeros(shape)) for shape in shapes]
        self.optimizer = torch.optim.SGD(self.params, lr=0.01)

    def apply_gradients(self, *gradients):
        summed = [np.stack(layer).sum(axis=0) for layer in zip(*gradients)]
        self.optimizer.zero_grad()
        for param, grad in zip(self.params, summed):
            param.grad = torch.from_numpy(grad)
        self.optimizer.step()
        return [p.detach().numpy() for p in self.params]


@ray.remote
class BaselineWorker:
    def __init__(self, shapes):
        self.grads = [np.random.default_rng(0).standard_normal(shape).astype(np.float32) for shape in shapes]

    def push_for(self, server, seconds: float) -> int:
        def push():
            fresh = [g.copy() for g in self.grads]
            ray.get(server.apply_gradients.remote(fresh))

        return timed_pushes(push, seconds)


@ray.remote
class ShardWorker:
    """Pushes the way ``AsyncWorker`` does: through its ``Outbox``."""

    def __init__(self, index: int, total: int, shards, ranges, run_token: str):
        self.grad = np.random.default_rng(0).standard_normal(total).astype(np.float32)
        self.outbox = Outbox(index, shards, ranges, run_token)

    def push_for(self, seconds: float) -> int:
        def push():
            # A fresh gradient every push, written where the worker's backward pass writes it (its
            # shared buffer): the one copy that producing a gradient costs, as in the baseline.
            np.copyto(self.outbox.buffer, self.grad)
            self.outbox.push([(0, 0)] * len(self.outbox.shards), 0)

        return timed_pushes(push, seconds)

    def close(self) -> None:
        self.outbox.close()


def timed_pushes(push, seconds: float) -> int:
    """Pushes completed in ``seconds``, after a warm-up that is not counted (the object store
    faults in its shared-memory pages on first use, which would otherwise dominate a short run)."""
    warm_until = time.perf_counter() + WARMUP_SECONDS
    while time.perf_counter() < warm_until:
        push()
    pushes, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        push()
        pushes += 1
    return pushes


def memcpy_gbps() -> float:
    source, target = np.ones(64 << 20, dtype=np.float32), np.empty(64 << 20, dtype=np.float32)
    best = min(_timed(lambda: np.copyto(target, source)) for _ in range(5))
    return source.nbytes / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def push_throughput(total: int) -> tuple[float, float, int]:
    model = layer_model(total)
    shapes = [tuple(p.shape) for p in model.parameters()]
    params = sum(int(np.prod(s)) for s in shapes)

    server = ParameterServer.remote(shapes)
    workers = [BaselineWorker.remote(shapes) for _ in range(2)]
    baseline = sum(ray.get([w.push_for.remote(server, PUSH_SECONDS) for w in workers])) / PUSH_SECONDS
    for actor in [server, *workers]:
        ray.kill(actor)

    ranges = ParamLayout(("flat",), ((params,),)).shard_ranges(2)
    shards = [ParameterShard.options(max_concurrency=64).remote(
        i, np.zeros(b - a, np.float32), optimizer="sgd", lr=0.01, momentum=0.0, mode="async", num_workers=2,
        staleness_bound=0, staleness_aware_lr=False) for i, (a, b) in enumerate(ranges)]
    workers = [ShardWorker.remote(i, params, shards, ranges, uuid.uuid4().hex[:12]) for i in range(2)]
    ours = sum(ray.get([w.push_for.remote(PUSH_SECONDS) for w in workers])) / PUSH_SECONDS
    ray.get([w.close.remote() for w in workers])
    for actor in [*shards, *workers]:
        ray.kill(actor)
    return baseline, ours, params


def time_to_accuracy(target: float = 0.90, overrides: tuple[str, ...] = (), quiet: bool = False) -> dict[str, float]:
    root = Path(__file__).resolve().parents[1]
    # One step takes about 15 ms here; 45 ms more makes the last worker about 4x slower.
    common = ["workers.num_workers=3", "workers.straggler_delay_s=0.045", "workers.epochs=8",
              f"run.stop_at_accuracy={target}", "run.eval_every_s=0.5", "run.output_dir=/tmp/scaleforge-bench-ps",
              "artifact.dir=/tmp/scaleforge-bench-ps/model", *overrides]
    times = {}
    for mode in ("sync", "async", "ssp"):
        cfg = load_config(AsyncSGDConfig, root / "configs/async_sgd.yaml", [*common, f"server.mode={mode}"],
                          preflight=check_runnable)
        with contextlib.redirect_stdout(sys.stderr):  # the run's progress lines: on screen, not in the table
            result = run_async_sgd(cfg)
        reached = [p["seconds"] for p in result.curve if p["test_accuracy"] >= target]
        times[mode] = reached[0] if reached else float("nan")
        if not quiet:
            print(f"   {mode:5s} reached {target:.2f} after {times[mode]:6.1f} s of training "
                  f"({result.updates} updates, {result.updates / result.wall_s:.1f}/s)", flush=True)
    return times


def learning_rate_sweep(rates: tuple[float, ...] = (0.002, 0.004, 0.008)) -> None:
    """Part b at several learning rates: is the verdict an artefact of one setting? Each mode is
    then compared at its own best rate (a tuned sync is the baseline a user would run)."""
    print("c. Part b at several Adam learning rates (seconds to 0.90; '-' = not reached in 8 epochs)")
    print(f"   {'lr':>7s} {'sync':>7s} {'async':>7s} {'ssp':>7s}")
    table = {}
    for lr in rates:
        table[lr] = time_to_accuracy(overrides=(f"server.lr={lr}",), quiet=True)
        print(f"   {lr:7.3f} " + " ".join(f"{t:7.1f}" if t == t else f"{'-':>7s}" for t in table[lr].values()),
              flush=True)
    best = {mode: min((t[mode] for t in table.values() if t[mode] == t[mode]), default=float("nan"))
            for mode in ("sync", "async", "ssp")}
    print(f"   each at its best rate: async / sync = {best['async'] / best['sync']:.2f}, "
          f"ssp / sync = {best['ssp'] / best['sync']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="ab", help="which parts to run: a (push throughput), b (time to "
                        "accuracy), c (b at several learning rates; about 4 minutes, not in the default run)")
    parts = parser.parse_args().parts
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    if "a" in parts:
        push_table()
    if "b" in parts:
        print("b. Time to 0.90 test accuracy, 3 workers, the last one 4x slower")
        times = time_to_accuracy()
        print(f"   async / sync = {times['async'] / times['sync']:.2f}, ssp / sync = {times['ssp'] / times['sync']:.2f} "
              "(target <= 0.6)")
    if "c" in parts:
        learning_rate_sweep()


def push_table() -> None:
    bandwidth = memcpy_gbps()
    print(f"a. Push throughput, 2 workers, {PUSH_SECONDS:.0f} s each; memcpy bandwidth here {bandwidth:.1f} GB/s")
    print(f"   {'params':>10s} {'baseline upd/s':>15s} {'ours upd/s':>11s} {'ratio':>6s} {'ours GB/s':>10s} {'of memcpy':>10s}")
    for total in (1_000_000, 10_000_000):
        baseline, ours, params = push_throughput(total)
        gbps = ours * params * 4 / 1e9
        print(f"   {params:10,d} {baseline:15.1f} {ours:11.1f} {ours / baseline:5.1f}x {gbps:10.2f} "
              f"{gbps / bandwidth:9.0%}", flush=True)


if __name__ == "__main__":
    main()
