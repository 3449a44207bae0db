"""b. Full loop: time to 0.90, ours (``run_async_sgd``) against the documentation's driver loop."""

import contextlib
import math
import sys
import threading
import time

import ray
from peers.docs_paramserver import DataWorker, ParameterServer, set_weights

from paramserver_parts.common import (
    EVAL_EVERY_S,
    TARGET,
    median_to_target,
    ps_config,
    ratio_of,
    ratio_shown,
    reached,
    seconds_shown,
)
from scaleforge.config import AsyncSGDConfig
from scaleforge.data.in_memory import load_in_memory
from scaleforge.models import build_model
from scaleforge.paramserver import run_async_sgd, worker_shards
from scaleforge.paramserver.run import held_out_score


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
            f"   {name:21s} "
            + ", ".join(
                f"{s:5.1f} s ({u} updates, {u / s:.0f}/s)"
                if u
                else f"never within {cfg.workers.epochs} epochs"
                for s, u in runs[side]
            ),
            flush=True,
        )
    return {side: median_to_target(s for s, _ in results) for side, results in runs.items()}


def loop_rows(repeats: int) -> list:
    times = full_loop(repeats)
    ratio = ratio_of(times["ours"], times["docs"])
    return [
        (
            f"b. time to {TARGET:.2f}, async: ours / docs",
            f"{seconds_shown(times['ours'])} / {seconds_shown(times['docs'])} = {ratio_shown(ratio)}",
            "<= 0.7",
            ratio <= 0.7,
        )
    ]
