"""Parameter server: ours against the one Ray's documentation builds, the same work on each side.

    .venv/bin/python bench/paramserver.py        (about 20 minutes on 2 idle cores, longer on busy ones)
    .venv/bin/python bench/paramserver.py --parts throughput --runs 1 --seconds 3      (part a alone, shorter)

The baseline is the parameter server of Ray's documentation ("Parameter Server", Ray Core
examples): one ``ParameterServer`` actor whose ``apply_gradients(*gradients)`` sums the per-layer
numpy gradients (``np.stack(...).sum(axis=0)``), steps a torch optimiser and returns the weights
(``{k: v.cpu() for k, v in state_dict().items()}``), and ``DataWorker`` actors whose
``compute_gradients(weights)`` loads those weights, computes a gradient and returns it as a list of
per-layer numpy arrays. Its asynchronous driver keeps one ``compute_gradients`` outstanding per
worker, takes the first ready with ``ray.wait``, submits ``ps.apply_gradients.remote(ready)`` and
hands that call's result (the fresh weights) to the same worker's next ``compute_gradients``.

a. Push and pull throughput. Per step each side moves one fresh gradient in and the fresh
   parameters out, and the worker loads them into its model:
   - ours: 2 real ``AsyncWorker`` actors run their own ``run`` loop one step at a time (pull every
     shard, copy each slice from the shard's shared-memory window into the model, write the
     gradient into the shared ``Outbox`` buffer, push to every shard); the parameters are split
     over 2 ``ParameterShard`` actors as ``run_async_sgd`` splits and starts them. Only the forward and backward pass are skipped: the worker's
     gradient function is replaced, in its own process, by the last half of the real one (the
     per-layer ``.grad`` tensors, set once, concatenated into the shared buffer, a fresh write
     every step).
   - the documentation's: the same model and the same 2 workers, whose ``compute_gradients`` loads
     the weights and returns the per-layer ``.grad`` arrays (also set once; Ray writes them into a
     fresh object every step), under the documentation's asynchronous driver loop.
   - for reference only (column docs-np, no bar): the documentation's server with one change, the
     weights returned as numpy arrays, which Ray passes without pickling their bytes as it does a
     torch tensor's.
   Same model (an MLP of 4 equal Linear layers), same plain SGD, same 2 workers with 1 CPU each,
   same Ray instance, same seconds after the same 1.5 s warm-up. Updates/s on each side; bytes
   moved = updates/s x parameters x 4 bytes x 2 (gradient in, parameters out), set against this
   machine's memcpy bandwidth (best of 5 copies of 256 MB).
b. Full loop: time to 0.90 test accuracy on MNIST-1D, ``configs/async_sgd.yaml`` (cnn1d, Adam
   lr 0.004, batch 64, 2 workers, 8 epochs at most). Ours: ``run_async_sgd`` in mode async with one
   shard, as the documentation has one server (a model this small gains nothing from a second
   shard: every step would cost two more calls). The
   documentation's: its driver loop with the same model and initial weights (same seed), the
   same optimiser on the server, each worker on the same data shard in the same batch order
   (``worker_shards``, ``batches``), 1 torch thread and 1 CPU per worker, the same cap on updates.
   The clock starts once every actor is up. Evaluation is charged alike: on both sides the driver
   measures test accuracy on the full test set with 1 torch thread, 0.5 s after the end of its
   previous measurement, while the workers go on training (ours in ``run_async_sgd``'s own loop;
   the documentation's in a driver thread beside its loop, so that evaluating never holds up an
   update). Each run stops at the first measurement >= 0.90. Each side runs ``--repeats`` times
   (default 5), alternating; the median counts.
c. Stragglers, each kind with the remedy the literature gives it: ``configs/async_sgd.yaml`` on 3
   workers and one shard (as in part b), time to 0.90 from the moment every worker is up.
   - persistent: the last worker always 4x slower (it sleeps 3 step times, measured at the start). Plain sync waits for it every round; sync with
     one backup worker (Chen et al. 2016) applies the first 2 gradients of each round and drops the
     late one; async applies every gradient as it comes, its step divided by its staleness.
   - transient: each step of each worker 4x slower with probability 0.2, independently and seeded
     (Ho et al. 2013). Sync waits for the slowest of 3 at every step; SSP (s=3) lets a worker run up
     to 3 steps ahead of the slowest. The gradients SSP applies are stale by the other workers'
     updates in between, so its workers compute each at the parameters predicted for when it lands
     (``workers.weight_prediction``: SpecTrain, Chen et al. 2018; DANA, Hakimi et al. 2019). Every run here
     trains all of 5 epochs, so that both modes' final accuracy is taken after the same work: the
     same gradients computed and applied (sync averages 3 per update, SSP applies each).
   Each mode runs at 4 Adam learning rates (more where its best is at the grid's edge) on seeds 0
   to 2, and at the rate of the least median time on seeds 3 to 6 too (data split, batch order,
   initial weights and delays all follow the seed); the median of the 7 seeds counts and their
   spread is printed. Under transient stragglers, one worker with no delay then applies ssp's
   updates (a batch at its rate), to split the gradients ssp needs over sync's into what its
   updates need without staleness and what the staleness adds; and one process with no Ray
   applies the same updates, each exactly 0, 1 or 2 updates stale, with and without the weight
   prediction, to measure staleness alone and what the prediction takes back.
d. Elastic capacity: async on 2 workers, 4 from 4 s, 1 from 10 s, each worker's 8 epochs; the
   report's plot (copied to ``docs/paramserver_elastic.png``) draws the workers over
   accuracy.
e. The language-model workload: ``configs/async_sgd_lm.yaml`` as it stands (the decoder of
   ``train_lm_tiny.yaml``, one flat vector over 2 shards, 2 workers, 3 epochs of 300 kB of standard
   library source) in async and in sync mode, each scored in validation bits per byte against the
   unigram entropy of its corpus, the best a model that ignores context can do.

Targets: a. at 10M parameters, ours / the documentation's >= 2.5x in every one of ``--runs`` runs
(5), and ours' bytes moved >= 25% of memcpy bandwidth; b. ours / the documentation's <= 0.7;
c. persistent: sync with a backup worker / sync <= 0.6 and async / sync <= 0.6; transient: ssp /
sync <= 0.75, and ssp's final accuracy (mean of the seeds) at most 0.5 point below sync's; d. the run
ends at >= 0.92 test accuracy; e. each mode's validation bits per byte below the unigram entropy.
Ends with each target beside its measurement (met / missed); exit status 1 if one was missed.
"""

import argparse
import contextlib
import math
import os
import statistics
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path

import numpy as np
import ray
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

from bars import print_bars  # noqa: E402

from scaleforge.config import AsyncSGDConfig, load_config  # noqa: E402
from scaleforge.config.models import MLPSpec  # noqa: E402
from scaleforge.data.in_memory import load_in_memory  # noqa: E402
from scaleforge.models import MODEL_SPEC, build_model  # noqa: E402
from scaleforge.paramserver import run_async_sgd, worker_shards  # noqa: E402
from scaleforge.paramserver.layout import ParamLayout  # noqa: E402
from scaleforge.paramserver.preflight import check_runnable  # noqa: E402
from scaleforge.paramserver.report import workers_over_time  # noqa: E402
from scaleforge.paramserver.run import held_out_score  # noqa: E402
from scaleforge.paramserver.shard import ParameterShard  # noqa: E402
from scaleforge.paramserver.worker import AsyncWorker, WeightPredictor, batches, gradient  # noqa: E402

WARMUP_SECONDS = 1.5
TARGET = 0.90
EVAL_EVERY_S = 0.5


# --- The documentation's parameter server -----------------------------------------------------
# Its model helpers (the documentation's ConvNet methods), over any torch module.


def get_weights(model: torch.nn.Module, as_numpy: bool = False) -> dict:
    """The documentation's ``{k: v.cpu() ...}``; ``as_numpy``: numpy arrays instead of tensors, which
    Ray's object store passes without pickling their bytes (a faster variant, part a only)."""
    return {k: v.cpu().numpy() if as_numpy else v.cpu() for k, v in model.state_dict().items()}


def set_weights(model: torch.nn.Module, weights: dict) -> None:
    with warnings.catch_warnings():  # numpy weights from the object store are read-only; they are only read
        warnings.simplefilter("ignore", UserWarning)
        model.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})


def get_gradients(model: torch.nn.Module) -> list:
    return [None if p.grad is None else p.grad.data.cpu().numpy() for p in model.parameters()]


def set_gradients(model: torch.nn.Module, gradients: list) -> None:
    for g, p in zip(gradients, model.parameters()):
        if g is not None:
            p.grad = torch.from_numpy(g)


def make_optimizer(params, optimizer: str, lr: float, momentum: float = 0.0):
    """The optimiser ``ParameterShard`` builds for its slice, here for the whole model."""
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


@ray.remote
class ParameterServer:
    """Ray's documentation parameter server (model, optimiser and seed as our side's)."""

    def __init__(
        self,
        model: dict,
        input_dim: int,
        num_classes: int,
        seed: int,
        optimizer: str,
        lr: float,
        momentum: float = 0.0,
        numpy_weights: bool = False,
    ):
        torch.set_num_threads(1)
        self.numpy_weights = numpy_weights
        torch.manual_seed(seed)
        self.model = build_model(MODEL_SPEC.validate_python(model), input_dim, num_classes)
        self.optimizer = make_optimizer(self.model.parameters(), optimizer, lr, momentum)

    def apply_gradients(self, *gradients):
        summed_gradients = [np.stack(gradient_zip).sum(axis=0) for gradient_zip in zip(*gradients)]
        self.optimizer.zero_grad()
        set_gradients(self.model, summed_gradients)
        self.optimizer.step()
        return get_weights(self.model, self.numpy_weights)

    def get_weights(self):
        return get_weights(self.model, self.numpy_weights)


@ray.remote
class DataWorker:
    """Ray's documentation worker, on its shard of the data in the order ``AsyncWorker`` draws it.

    ``precomputed``: skip the forward and backward pass and return ``.grad`` tensors set once (part a).
    """

    def __init__(
        self,
        index: int,
        model: dict,
        input_dim: int,
        num_classes: int,
        x: np.ndarray,
        y: np.ndarray,
        batch_size: int,
        seed: int,
        precomputed: bool = False,
    ):
        torch.set_num_threads(1)
        self.model = build_model(MODEL_SPEC.validate_python(model), input_dim, num_classes)
        self.batches = batches(x, y, batch_size, seed)
        self.precomputed = precomputed
        if precomputed:
            set_random_grads(self.model, index)

    def ready(self) -> bool:
        return True

    def compute_gradients(self, weights):
        set_weights(self.model, weights)
        if not self.precomputed:
            data, target = next(self.batches)
            self.model.zero_grad()
            loss = F.cross_entropy(self.model(data), target)
            loss.backward()
        return get_gradients(self.model)


def set_random_grads(model: torch.nn.Module, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.grad = torch.from_numpy(rng.standard_normal(tuple(p.shape), dtype=np.float32))


# --- a. Push and pull throughput -------------------------------------------------------------------


def mlp(total: int) -> tuple[dict, int]:
    """An MLP spec of 4 equal Linear layers (width in, width out) with about ``total`` parameters."""
    width = int((total / 4) ** 0.5)
    return MLPSpec(hidden=[width] * 3).model_dump(mode="json"), width


def docs_throughput(model: dict, width: int, seconds: float, numpy_weights: bool = False) -> float:
    """Updates/s of the documentation's asynchronous driver loop, 2 workers."""
    ps = ParameterServer.options(num_cpus=0.01).remote(
        model, width, width, 0, "sgd", 0.01, numpy_weights=numpy_weights
    )
    x, y = np.zeros((64, width), np.float32), np.zeros(64, np.int64)
    workers = [
        DataWorker.options(num_cpus=1).remote(i, model, width, width, x, y, 64, i, precomputed=True)
        for i in range(2)
    ]
    try:
        ray.get([w.ready.remote() for w in workers])
        current_weights = ps.get_weights.remote()
        ray.get(current_weights)
        gradients = {w.compute_gradients.remote(current_weights): w for w in workers}

        def loop(until: float) -> int:
            nonlocal current_weights
            updates = 0
            while time.perf_counter() < until:
                ready, _ = ray.wait(list(gradients))
                worker = gradients.pop(ready[0])
                current_weights = ps.apply_gradients.remote(*[ready[0]])
                gradients[worker.compute_gradients.remote(current_weights)] = worker
                updates += 1
            return updates

        loop(time.perf_counter() + WARMUP_SECONDS)
        start = time.perf_counter()
        updates = loop(start + seconds)
        ray.get(current_weights)  # the last update counted has been applied
        return updates / (time.perf_counter() - start)
    finally:
        for actor in [ps, *workers]:
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


def our_throughput(model: dict, width: int, seconds: float) -> float:
    """Updates/s of 2 ``AsyncWorker`` actors (pull, load, write gradient, push) on 2 shards."""
    torch.manual_seed(0)
    layout = ParamLayout.of(build_model(MODEL_SPEC.validate_python(model), width, width))
    ranges = layout.shard_ranges(2)
    token = uuid.uuid4().hex[:12]
    shards = [
        ParameterShard.options(num_cpus=0.01, max_concurrency=64).remote(
            i,
            np.zeros(b - a, np.float32),
            optimizer="sgd",
            lr=0.01,
            momentum=0.0,
            mode="async",
            num_workers=2,
            staleness_bound=0,
            staleness_aware_lr=False,
            run_token=token,
        )
        for i, (a, b) in enumerate(ranges)
    ]
    x, y = np.zeros((64, width), np.float32), np.zeros(64, np.int64)
    workers = [
        AsyncWorker.options(num_cpus=1).remote(
            i, model, width, width, x, y, 64, i, shards, ranges, run_token=token
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


def push_pull_table(seconds: float, sizes: tuple[int, ...], header: bool = True) -> dict[int, dict]:
    bandwidth = memcpy_gbps()
    if header:
        print(
            f"a. Push + pull throughput, 2 workers, {seconds:g} s each side; memcpy bandwidth here {bandwidth:.1f} GB/s."
            "\n   docs: the documentation's server as written (weights returned as torch tensors); docs-np: the same"
            "\n   with the weights returned as numpy arrays (a faster variant, for reference). GB/s = updates/s x"
            "\n   parameters x 4 bytes x 2 (gradient in, parameters out)"
        )
        print(
            f"   {'params':>10s} {'docs upd/s':>11s} {'docs-np':>8s} {'ours upd/s':>11s} {'ratio':>6s} {'vs np':>6s} "
            f"{'docs GB/s':>10s} {'ours GB/s':>10s} {'of memcpy':>10s}"
        )
    results = {}
    for total in sizes:
        model, width = mlp(total)
        params = 4 * (width * width + width)
        docs = docs_throughput(model, width, seconds)
        docs_np = docs_throughput(model, width, seconds, numpy_weights=True)
        ours = our_throughput(model, width, seconds)
        moved = {side: rate * params * 4 * 2 / 1e9 for side, rate in (("docs", docs), ("ours", ours))}
        results[total] = {
            "params": params,
            "docs": docs,
            "docs_np": docs_np,
            "ours": ours,
            "ours_gbps": moved["ours"],
            "share": moved["ours"] / bandwidth,
            "bandwidth": bandwidth,
        }
        print(
            f"   {params:10,d} {docs:11.1f} {docs_np:8.1f} {ours:11.1f} {ours / docs:5.2f}x {ours / docs_np:5.2f}x "
            f"{moved['docs']:10.2f} {moved['ours']:10.2f} {moved['ours'] / bandwidth:9.0%}",
            flush=True,
        )
    return results


# --- b. Full loop: time to 0.90, ours against the documentation's driver loop -----------------------


def ps_config(*overrides: str) -> AsyncSGDConfig:
    common = [
        "workers.epochs=8",
        f"run.stop_at_accuracy={TARGET}",
        f"run.eval_every_s={EVAL_EVERY_S}",
        "run.output_dir=/tmp/scaleforge-bench-ps",
        "artifact.dir=/tmp/scaleforge-bench-ps/model",
    ]
    return load_config(
        AsyncSGDConfig, ROOT / "configs/async_sgd.yaml", [*common, *overrides], preflight=check_runnable
    )


def reached(curve: list[dict]) -> tuple[float, int]:
    """(seconds, updates) at the first measurement >= the target; nan if none."""
    hits = [p for p in curve if p["test_accuracy"] >= TARGET]
    return (hits[0]["seconds"], hits[0]["updates"]) if hits else (float("nan"), 0)


def ours_full_loop(cfg: AsyncSGDConfig) -> tuple[float, int]:
    with contextlib.redirect_stdout(sys.stderr):  # the run's progress lines: on screen, not in the table
        result = run_async_sgd(cfg)
    return reached(result.curve)


def docs_full_loop(cfg: AsyncSGDConfig) -> tuple[float, int]:
    """The documentation's asynchronous loop on ``cfg``'s model, data, optimiser and workers."""
    server, workers_cfg = cfg.server, cfg.workers
    data = load_in_memory(cfg.data)
    info, spec = data.info, cfg.model.model_dump(mode="json")
    splits = worker_shards(len(data.y), workers_cfg.num_workers, workers_cfg.seed)
    steps = math.ceil(workers_cfg.epochs * min(len(s) for s in splits) / workers_cfg.batch_size)
    ps = ParameterServer.options(num_cpus=0.01).remote(
        spec, info.input_dim, info.num_classes, workers_cfg.seed, server.optimizer, server.lr, server.momentum
    )
    workers = [
        DataWorker.options(num_cpus=1).remote(
            i,
            spec,
            info.input_dim,
            info.num_classes,
            data.x[rows],
            data.y[rows],
            workers_cfg.batch_size,
            workers_cfg.seed + i,
        )
        for i, rows in enumerate(splits)
    ]
    model = build_model(cfg.model, info.input_dim, info.num_classes)
    curve, updates, done = [], 0, threading.Event()
    try:
        ray.get([w.ready.remote() for w in workers] + [ps.get_weights.remote()])
        started = time.perf_counter()

        def evaluate() -> None:  # as run_async_sgd's loop: wait 0.5 s, measure, repeat
            while not done.wait(EVAL_EVERY_S):
                seconds, at = time.perf_counter() - started, updates
                set_weights(model, ray.get(ps.get_weights.remote()))
                curve.append(
                    {"seconds": seconds, "updates": at, "test_accuracy": held_out_score(model, data)}
                )
                print(
                    f"[docs] {seconds:6.1f}s  updates {at:6d}  test_acc {curve[-1]['test_accuracy']:.4f}",
                    file=sys.stderr,
                    flush=True,
                )
                if curve[-1]["test_accuracy"] >= TARGET:
                    done.set()

        evaluator = threading.Thread(target=evaluate, daemon=True)
        evaluator.start()
        current_weights = ps.get_weights.remote()
        gradients = {w.compute_gradients.remote(current_weights): w for w in workers}
        while not done.is_set() and updates < steps * len(workers):
            ready_gradient_list, _ = ray.wait(list(gradients))
            ready_gradient_id = ready_gradient_list[0]
            worker = gradients.pop(ready_gradient_id)
            current_weights = ps.apply_gradients.remote(*[ready_gradient_id])
            gradients[worker.compute_gradients.remote(current_weights)] = worker
            updates += 1
        done.set()
        evaluator.join()
    finally:
        for actor in [ps, *workers]:
            ray.kill(actor)
    return reached(curve)


def full_loop(repeats: int) -> dict:
    cfg = ps_config("server.mode=async", "server.num_shards=1")  # one server process a side
    print(
        f"b. Time to {TARGET:.2f} test accuracy, MNIST-1D, {cfg.workers.num_workers} workers, "
        f"{cfg.server.num_shards} shard, async, {repeats} run(s) a side, alternating"
    )
    runs = {"ours": [], "docs": []}
    for _ in range(repeats):
        runs["ours"].append(ours_full_loop(cfg))
        runs["docs"].append(docs_full_loop(cfg))
    for side, name in (("ours", "ours (run_async_sgd)"), ("docs", "documentation's loop")):
        print(
            f"   {name:21s} " + ", ".join(f"{s:5.1f} s ({u} updates, {u / s:.0f}/s)" for s, u in runs[side]),
            flush=True,
        )
    return {side: statistics.median(s for s, _ in results) for side, results in runs.items()}


# --- c. Stragglers: the remedy for each kind of delay ---------------------------------------------

SLOWDOWN = 4
"""A straggler's step takes this many times a normal one: it sleeps (SLOWDOWN - 1) x the step time
measured on this machine at the start of the part (``step_seconds``)."""
RATES = (0.0015, 0.003, 0.006, 0.012)
"""Adam learning rates of the sweep; each mode is compared at its own best (a tuned sync is the
baseline a user would run). Where the best is the grid's largest or smallest, the sweep goes on
beyond it (twice or half that) until a rate beyond the best is slower or the grid has 6 rates."""
SEEDS = tuple(range(7))
"""Seven seeds, four more than the issue asks: a run to 0.90 takes 5-15 s here and its seed moves it by
up to a third, so the median of three, or of five, moves with the draw by more than a bar's margin."""
SWEEP_SEEDS = SEEDS[:3]
"""The sweep runs every rate on these seeds and picks the rate of the least median time: one seed's
pick is a draw (on seed 0 alone, ssp's 0.006 beat 0.003 by 0.1 s, and 2 of the 7 seeds at 0.006 then
lost 10 points of accuracy late in the run)."""

TRANSIENT_P = 0.2
"""Transient stragglers: the chance that a step of a worker is SLOWDOWN x slower."""
PERSISTENT_BAR, TRANSIENT_BAR = 0.6, 0.75
"""The most a remedy's time to the target may be of plain sync's, per scenario."""
SCENARIOS = {
    # scenario: (what it means, the delay as config overrides of the extra seconds, the modes as overrides)
    "persistent": (
        "3 workers, the last one always 4x slower",
        ["workers.straggler_delay_s={delay}"],
        {
            "sync": ["server.mode=sync"],
            "sync, b=1 backup": ["server.mode=sync", "server.backup_workers=1"],
            "async, staleness-aware lr": ["server.mode=async", "server.staleness_aware_lr=true"],
        },
    ),
    "transient": (
        f"3 workers, each step of each worker 4x slower with probability {TRANSIENT_P} (seeded)",
        ["workers.transient_delay_s={delay}", f"workers.transient_delay_probability={TRANSIENT_P}"],
        {
            "sync": ["server.mode=sync"],
            "ssp, s=3, weight prediction": [
                "server.mode=ssp",
                "server.staleness_bound=3",
                "workers.weight_prediction=true",
            ],
        },
    ),
}


def straggler_run(delays: list[str], mode: list[str], lr: float, seed: int, to_the_end: bool) -> dict:
    """One run: seconds to the target, and the final accuracy after every worker's 5 epochs when
    ``to_the_end`` (else the run stops at the target, within 8 epochs)."""
    cfg = ps_config(
        "workers.num_workers=3",
        "server.num_shards=1",
        *delays,
        *mode,
        f"server.lr={lr}",
        f"workers.seed={seed}",
        *(["run.stop_at_accuracy=null", "workers.epochs=5"] if to_the_end else []),
    )
    with contextlib.redirect_stdout(sys.stderr):
        result = run_async_sgd(cfg)
    seconds, updates = reached(result.curve)
    per_update = (
        1 if cfg.server.mode != "sync" else 3 - cfg.server.backup_workers
    )  # gradients an update applies
    return {
        "seconds": seconds,
        "updates": updates,
        "final": result.test_accuracy,
        "grads_to_target": updates * per_update,
        "gradients": result.updates * per_update,
        "applied": result.updates,
        "staleness": float(np.mean(result.staleness["updates"] or [0])),
    }


def step_seconds() -> float:
    """A worker's step time in this part's setting (3 workers, one shard, async, no delay): wall-clock
    x workers / updates over one epoch."""
    cfg = ps_config(
        "workers.num_workers=3",
        "server.num_shards=1",
        "server.mode=async",
        "workers.epochs=1",
        "run.stop_at_accuracy=null",
    )
    with contextlib.redirect_stdout(sys.stderr):
        result = run_async_sgd(cfg)
    return result.wall_s * 3 / result.updates


def stragglers() -> list:
    """Per scenario and mode: a learning-rate sweep on the sweep seeds, then the other seeds at the
    best rate; under transient stragglers, also where ssp's gradients-to-target go (``_ssp_why``)."""
    rows, step = [], step_seconds()
    delay = round((SLOWDOWN - 1) * step, 4)
    print(
        f"c. A step of a worker takes {step * 1e3:.1f} ms here (3 workers, no delay, measured now); a "
        f"{SLOWDOWN}x slower step sleeps {delay * 1e3:.1f} ms more",
        flush=True,
    )
    for scenario, (meaning, delay_overrides, modes) in SCENARIOS.items():
        delays = [d.format(delay=delay) for d in delay_overrides]
        to_the_end = scenario == "transient"  # final accuracy after equal work is compared there
        print(
            f"c. {scenario} stragglers: {meaning}; seconds to {TARGET:.2f} test accuracy"
            + ("; every run trains its 5 epochs, for the final accuracy" if to_the_end else ""),
            flush=True,
        )
        best = {}
        for name, mode in modes.items():
            sweep = sweep_rates(lambda lr, seed: straggler_run(delays, mode, lr, seed, to_the_end))
            lr = _best_rate(sweep)
            runs = sweep[lr] + [
                straggler_run(delays, mode, lr, seed, to_the_end) for seed in SEEDS[len(SWEEP_SEEDS) :]
            ]
            best[name] = {
                "lr": lr,
                "runs": runs,
                "seconds": statistics.median(r["seconds"] for r in runs),
                "final": statistics.mean(r["final"] for r in runs),
            }
            print(
                f"   {name:28s} sweep, median of seeds {', '.join(map(str, SWEEP_SEEDS))}: "
                + ", ".join(f"lr {r:g} {_seconds(_median_seconds(sweep[r]))}" for r in sorted(sweep))
                + f"\n   {'':28s} best lr {lr:g}, seeds {', '.join(map(str, SEEDS))}: "
                + ", ".join(_seconds(r["seconds"]) for r in runs)
                + f" (median {_seconds(best[name]['seconds'])})"
                + (
                    "; final accuracy "
                    + ", ".join(f"{r['final']:.4f}" for r in runs)
                    + f" after {runs[0]['gradients']:,d} gradients ({runs[0]['applied']:,d} updates)"
                    if to_the_end
                    else ""
                ),
                flush=True,
            )
        for name in modes:  # why a mode wins or not: gradients it needs, and how fast it computes them
            runs = best[name]["runs"]
            print(
                f"   {name:28s} to {TARGET:.2f}: median {statistics.median(r['grads_to_target'] for r in runs):,.0f} "
                f"gradients at {statistics.median(r['grads_to_target'] / r['seconds'] for r in runs):.0f} gradients/s",
                flush=True,
            )
        if to_the_end:
            _ssp_why(best)
        sync = best["sync"]["seconds"]
        for name in modes:
            if name == "sync":
                continue
            ratio = best[name]["seconds"] / sync
            bar = PERSISTENT_BAR if scenario == "persistent" else TRANSIENT_BAR
            spread = "-".join(
                _seconds(x)
                for x in (
                    min(r["seconds"] for r in best[name]["runs"]),
                    max(r["seconds"] for r in best[name]["runs"]),
                )
            )
            rows.append(
                (
                    f"c. {scenario} straggler: {name} / sync, time to {TARGET:.2f}",
                    f"{best[name]['seconds']:.1f} / {sync:.1f} s = {ratio:.2f} (seeds {spread})",
                    f"<= {bar}",
                    ratio <= bar,
                )
            )
            if to_the_end:
                gap = best["sync"]["final"] - best[name]["final"]
                rows.append(
                    (
                        f"c. {scenario} straggler: {name} final accuracy, mean of {len(SEEDS)} seeds",
                        f"{best[name]['final']:.4f} vs sync {best['sync']['final']:.4f}",
                        ">= sync - 0.005",
                        gap <= 0.005,
                    )
                )
    return rows


def sweep_rates(run) -> dict[float, list[dict]]:
    """``run(lr, seed)`` on every sweep seed at each of ``RATES``, then beyond the grid's edge while
    the best rate is on it (up to 6 rates): {rate: the runs}."""
    sweep = {lr: [run(lr, seed) for seed in SWEEP_SEEDS] for lr in RATES}
    while len(sweep) < 6:
        best = _best_rate(sweep)
        edge = 2 * best if best == max(sweep) else best / 2 if best == min(sweep) else None
        if edge is None or _median_seconds(sweep[best]) == math.inf:
            break
        sweep[edge] = [run(edge, seed) for seed in SWEEP_SEEDS]
    return sweep


def _best_rate(sweep: dict[float, list[dict]]) -> float:
    """The rate of the least median time to the target."""
    return min(sweep, key=lambda r: _median_seconds(sweep[r]))


def _median_seconds(runs: list[dict]) -> float:
    """The median time to the target of ``runs``; a run that never got there counts as never."""
    return statistics.median(r["seconds"] if r["seconds"] == r["seconds"] else math.inf for r in runs)


def one_worker_run(lr: float, seed: int) -> int:
    """Gradients (= updates) that one worker, with no delay and so no staleness, takes to the target
    with Adam at ``lr``; 0 if it never gets there."""
    cfg = ps_config(
        "workers.num_workers=1",
        "server.num_shards=1",
        "server.mode=async",
        f"server.lr={lr}",
        f"workers.seed={seed}",
        "workers.epochs=12",
    )
    with contextlib.redirect_stdout(sys.stderr):
        result = run_async_sgd(cfg)
    seconds, updates = reached(result.curve)
    return updates if seconds == seconds else 0


def stale_updates(
    lr: float, tau: int, seed: int, predict: bool = False, workers: int = 3, limit: int = 3000
) -> int:
    """Gradients to the target in one process, with no Ray and no clock: ssp's updates (Adam on the
    flat parameters, as a shard applies them; the workers' batches taken in turn) each computed on
    the parameters of exactly ``tau`` updates before, or with ``predict`` on those a worker's
    ``WeightPredictor`` makes of them, told the staleness is ``tau``. Staleness alone, measured every
    20 updates; 0 if not within ``limit``."""
    cfg = ps_config(f"workers.seed={seed}", f"workers.num_workers={workers}")
    data = load_in_memory(cfg.data)
    torch.manual_seed(seed)
    model = build_model(cfg.model, data.info.input_dim, data.info.num_classes)
    layout = ParamLayout.of(model)
    flat = torch.nn.Parameter(torch.from_numpy(layout.flatten(model).copy()))
    optimizer = torch.optim.Adam([flat], lr=lr)
    streams = [
        batches(data.x[rows], data.y[rows], cfg.workers.batch_size, seed + i)
        for i, rows in enumerate(worker_shards(len(data.y), workers, seed))
    ]
    predictors = [WeightPredictor([(0, layout.total)]) for _ in range(workers)]
    for predictor in predictors:
        predictor.staleness = [float(tau)]
    read = [flat.detach().clone()] * (tau + 1)  # the parameters after each of the last tau + 1 updates
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for update in range(1, limit + 1):
            params = read[0].numpy().copy()
            if predict:  # the worker whose turn it is reads version update - 1 - tau
                predictors[update % workers].predict(params, [(max(0, update - 1 - tau), 0)])
            layout.assign(model, params)
            grad, _ = gradient(model, layout, *next(streams[update % workers]))
            flat.grad = torch.from_numpy(grad)
            optimizer.step()
            read = read[1:] + [flat.detach().clone()]
            if update % 20 == 0:
                layout.assign(model, flat.detach().numpy())
                if data.score(model) >= TARGET:
                    return update
    finally:
        torch.set_num_threads(threads)
    return 0


def _ssp_why(best: dict, workers: int = 3) -> None:
    """Why SSP wins or loses under transient stragglers: its time over sync's is the gradients it needs
    over sync's (G) times sync's pace over its own (medians of the seeds, so the product is close to the
    measured ratio, not equal to it). Sync's round waits for the slowest of the workers, 1 + (k - 1)(1 -
    (1 - p)^N) steps expected; an SSP worker that never waits takes 1 + p (k - 1) steps a gradient: the
    most SSP's pace can gain on idle cores. The bar then needs G at most the bar times the pace gain.

    G itself splits in two, from one worker with no delay, so no staleness, applying ssp's updates
    (a batch at ssp's rate) on the same seeds: what those updates need without staleness, over sync's
    gradients (sync's are stale-free already: every round reads the last update), times what the
    staleness of the workers' updates in between then adds."""
    needed = {name: statistics.median(r["grads_to_target"] for r in best[name]["runs"]) for name in best}
    pace = {
        name: statistics.median(r["grads_to_target"] / r["seconds"] for r in best[name]["runs"])
        for name in best
    }
    (ssp,) = [name for name in best if name != "sync"]
    gain = (1 + (SLOWDOWN - 1) * (1 - (1 - TRANSIENT_P) ** workers)) / (1 + TRANSIENT_P * (SLOWDOWN - 1))
    g, measured_gain = needed[ssp] / needed["sync"], pace[ssp] / pace["sync"]
    print(
        f"   why: {ssp}/sync = G x sync's pace / ssp's = {g:.2f} x {pace['sync']:.0f} / {pace[ssp]:.0f} gradients/s = "
        f"{g / measured_gain:.2f}, G the gradients ssp needed over sync's. SSP's pace gain on idle cores, none of its "
        f"workers ever waiting: {gain:.2f}x (measured {measured_gain:.2f}x); so ssp/sync <= {TRANSIENT_BAR} needs "
        f"G <= {TRANSIENT_BAR * gain:.2f} ({TRANSIENT_BAR * measured_gain:.2f} at the measured paces)",
        flush=True,
    )
    alone = [one_worker_run(best[ssp]["lr"], seed) for seed in SEEDS]
    if not all(alone):
        print(
            f"   G's parts: not measured (one worker did not reach {TARGET:.2f} on every seed: {alone})",
            flush=True,
        )
        return
    one = statistics.median(alone)
    print(
        f"   G's parts: one worker with no delay (no staleness) applying ssp's updates (lr {best[ssp]['lr']:g}) "
        f"takes {one:,.0f} gradients (median of {', '.join(map(str, alone))}); so G = {one / needed['sync']:.2f} "
        f"(ssp's updates without staleness, {one:,.0f} / {needed['sync']:,.0f}) x {needed[ssp] / one:.2f} (the "
        f"staleness of {workers} workers, {needed[ssp]:,.0f} / {one:,.0f})",
        flush=True,
    )
    cases = {
        "tau 0": (0, False),
        "tau 1": (1, False),
        "tau 1 predicted": (1, True),
        "tau 2": (2, False),
        "tau 2 predicted": (2, True),
    }
    stale = {
        name: [stale_updates(best[ssp]["lr"], tau, seed, predict) for seed in SEEDS]
        for name, (tau, predict) in cases.items()
    }
    print(
        f"   staleness alone, one process with no Ray, ssp's updates at lr {best[ssp]['lr']:g}, each computed on the "
        f"parameters of exactly tau updates before (predicted: on the workers' weight prediction of them): "
        + "; ".join(
            f"{name}: {statistics.median(runs):,.0f} gradients ("
            + ", ".join(str(r) if r else "-" for r in runs)
            + ")"
            for name, runs in stale.items()
        )
        + f" (- never within 3,000; ssp's mean staleness with "
        f"{workers} workers: {statistics.mean(r['staleness'] for r in best[ssp]['runs']):.2f} updates)",
        flush=True,
    )


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if math.isfinite(value) else "-"


# --- d. Elastic capacity ----------------------------------------------------------------------------

ELASTIC_BAR = 0.92


def elastic() -> list:
    """2 workers, 4 from 4 s, 1 from 10 s, each worker's 8 epochs; the plot shows both lines."""
    cfg = ps_config(
        "workers.num_workers=2",
        "run.stop_at_accuracy=null",
        "workers.scaling=[{at_s: 4, workers: 4}, {at_s: 10, workers: 1}]",
    )
    with contextlib.redirect_stdout(sys.stderr):
        result = run_async_sgd(cfg)
    plot = ROOT / "docs/paramserver_elastic.png"
    plot.parent.mkdir(parents=True, exist_ok=True)
    plot.write_bytes(Path(result.plot_path).read_bytes())
    timeline = workers_over_time(result)
    print(
        f"d. Elastic: async, {cfg.workers.num_workers} workers, then 4 from 4 s, then 1 from 10 s; "
        f"plot {plot.relative_to(ROOT)}\n   workers over time: "
        + ", ".join(f"{n} from {t:.1f} s" for t, n in timeline[:-1])
        + f"; {result.updates} updates in {result.wall_s:.1f} s, final test accuracy {result.test_accuracy:.4f}",
        flush=True,
    )
    counts = [n for _, n in timeline]
    shape = counts[0] == 2 and max(counts) == 4 and counts[-1] == 1
    return [
        (
            "d. elastic 2 -> 4 -> 1 workers: final test accuracy",
            f"{result.test_accuracy:.4f} ({' -> '.join(map(str, _runs(counts)))} workers)",
            f">= {ELASTIC_BAR}",
            shape and result.test_accuracy >= ELASTIC_BAR,
        )
    ]


def language_model() -> list:
    """``configs/async_sgd_lm.yaml`` in async and sync mode; validation bits per byte of each against
    the unigram entropy of the corpus (training and validation bytes together)."""
    from scaleforge.text.tokenizer import unigram_bits_per_byte

    rows = []
    for mode in ("async", "sync"):
        cfg = load_config(
            AsyncSGDConfig,
            ROOT / "configs/async_sgd_lm.yaml",
            [
                f"server.mode={mode}",
                f"run.output_dir=/tmp/scaleforge-bench-ps-lm/{mode}",
                f"artifact.dir=/tmp/scaleforge-bench-ps-lm/{mode}/model",
            ],
            preflight=check_runnable,
        )
        with contextlib.redirect_stdout(sys.stderr):
            result = run_async_sgd(cfg)
        data = load_in_memory(cfg.data)
        unigram = unigram_bits_per_byte(
            np.concatenate([data.x.ravel(), data.x_test.ravel()]).astype(np.uint8).tobytes()
        )
        print(
            f"e. Language model ({cfg.model.name}, {cfg.model.num_layers} layers, d_model {cfg.model.d_model}), "
            f"{mode}: {cfg.server.num_shards} shards, {cfg.workers.num_workers} workers, {cfg.workers.epochs} epochs, "
            f"{result.updates} updates in {result.wall_s:.1f} s; validation {result.score:.3f} bits per byte, "
            f"unigram entropy {unigram:.3f}",
            flush=True,
        )
        rows.append(
            (
                f"e. language model, {mode}: validation bits per byte",
                f"{result.score:.3f}",
                f"< {unigram:.3f} (unigram)",
                result.metric == "bits_per_byte" and result.score < unigram,
            )
        )
    return rows


def _runs(counts: list[int]) -> list[int]:
    """The distinct levels in order (2, 3, 4, 3, 2, 1 -> the same; repeated levels collapse)."""
    return [n for i, n in enumerate(counts) if i == 0 or n != counts[i - 1]]


PARTS = {
    "throughput": "a. push + pull throughput against the documentation's server, 5 runs at 10M",
    "loop": "b. full loop, time to 0.90 against the documentation's loop",
    "stragglers": f"c. persistent and transient stragglers, each mode at its best learning rate, {len(SEEDS)} seeds",
    "elastic": "d. a run on 2, then 4, then 1 worker",
    "lm": "e. the language-model workload in async and sync mode",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help="comma-separated, of: " + "; ".join(f"{k} ({v})" for k, v in PARTS.items()),
    )
    parser.add_argument(
        "--seconds", type=float, default=6.0, help="throughput: measured seconds per side and size"
    )
    parser.add_argument(
        "--sizes", default="1000000,10000000", help="throughput: parameter counts (the bars are at 10M)"
    )
    parser.add_argument(
        "--runs", type=int, default=5, help="throughput: runs at 10M (every one must meet the bar)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="loop: runs per side (the median counts)")
    args = parser.parse_args()
    parts = args.parts.split(",")
    if unknown := set(parts) - set(PARTS):
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}: choose from {', '.join(PARTS)}")
    started_load = os.getloadavg()[0]
    # 6 logical CPUs: the elastic part holds 4 workers (1 CPU each) beside its 2 in a placement group.
    ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False)
    rows = []
    if "throughput" in parts:
        rows += throughput(args)
    if "loop" in parts:
        times = full_loop(args.repeats)
        ratio = times["ours"] / times["docs"]
        rows.append(
            (
                f"b. time to {TARGET:.2f}, async: ours / docs",
                f"{times['ours']:.1f} / {times['docs']:.1f} s = {ratio:.2f}",
                "<= 0.7",
                ratio <= 0.7,
            )
        )
    if "stragglers" in parts:
        rows += stragglers()
    if "elastic" in parts:
        rows += elastic()
    if "lm" in parts:
        rows += language_model()
    load = os.getloadavg()[0]
    print(
        f"\nLoad average (1 min) of this machine ({os.cpu_count()} cores): {started_load:.1f} at the start, "
        f"{load:.1f} at the end (other processes share the cores; the sides run one after the other, alternating in part b)\n"
    )
    return print_bars(rows, "parameter server")


def throughput(args) -> list:
    """The table at every size once, then more runs at 10M; the bar holds in every run."""
    results = push_pull_table(args.seconds, tuple(int(s) for s in args.sizes.split(",")))
    if 10_000_000 not in results:
        return []
    first = results[10_000_000]
    runs = [first] + [
        push_pull_table(args.seconds, (10_000_000,), header=False)[10_000_000] for _ in range(args.runs - 1)
    ]
    ratios = [r["ours"] / r["docs"] for r in runs]
    label = f"a. push + pull, {first['params'] / 1e6:.0f}M params, 2 workers"
    return [
        (
            f"{label}: ours / docs, {len(runs)} runs",
            f"{min(ratios):.2f}x-{max(ratios):.2f}x (median {statistics.median(ratios):.2f}x)",
            ">= 2.5x in every run",
            min(ratios) >= 2.5,
        ),
        (
            f"{label}: bytes moved, of memcpy",
            f"{first['ours_gbps']:.2f} GB/s = {first['share']:.1%} of {first['bandwidth']:.1f} GB/s",
            ">= 25%",
            first["share"] >= 0.25,
        ),
    ]


if __name__ == "__main__":
    sys.exit(main())
