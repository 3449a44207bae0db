"""Serving, the same work on both sides, in one run: the cascade as ``configs/serve.yaml`` ships it (the
template ``make demo`` serves) against the same cascade in a plain FastAPI + uvicorn server
(bench/peers/plain_cascade.py), each measured with nothing of the other running.

    .venv/bin/python bench/serving.py [--seconds 10] [--rounds 3] [--serve-config configs/serve.yaml]
    (about 9 minutes on 2 idle cores: 3 rounds of about 3; plus training the models once, about 5 minutes;
    --seconds 2 --rounds 1: about a minute)

Both sides serve the same student and teacher artifacts (loaded by ``load_servable``, one torch thread
per model process), the cascade over them at the same threshold (calibrated like ``jobs.calibrate``,
0.5 point below the teacher, on half of the test split) and measure, and merge concurrent calls of a
model into one forward pass the same way (no added wait). Ours: the shipped config's cascade part
(its student, teacher and cascade router with every deployment setting as shipped; its MoE models,
which this bench does not train, left out), deployed by ``scaleforge.deployment.deploy`` on an embedded
Ray as ``jobs.serve`` and the demo deploy it, with its defaults (``scaleforge.runtime``: direct ingress
on, so that each ingress replica also answers HTTP on a port of its own, and Serve's low-overhead
settings). The plain peer: uvicorn with one worker per model process of ours, each worker loading both
models; V2 JSON or binary tensors in and out with orjson.

A round measures one side, shuts it down (``ray.shutdown()``: nothing of Ray runs while the plain
server is measured), then the other; the side that goes first alternates round by round. Every
server listens on 127.0.0.1 and gets V2 infer requests of 64 MNIST-1D inputs from closed-loop clients
(the library's load generator, the query stage's: ``scaleforge.pipeline.load``).

Throughput, 8 clients: the cascade at the ingress replicas' own ports (``direct``: the platform's
fastest documented path, the clients spread over the replicas) and through the proxy at Serve's HTTP
port (the default path: HAProxy, ``scaleforge.runtime.SERVE_HAPROXY``), and through Serve's Python
proxy (the default path until HAProxy took its port; HAProxy's fallback, printed without a bar); the
teacher alone through the proxy; the plain cascade and the plain teacher; the direct cascade and the
plain teacher again with the V2 binary tensor extension both ways. p50 latency at 1 client,
every input answered at stage 0 (``min_confidence=0``): the cascade direct and via proxy, the plain
cascade, and a bare ``@serve.batch`` Serve deployment of the student (bench/peers/serve_bare.py). Time
per hop at 1 client, from the ingress's ``Server-Timing`` header. CPU per request at several clients, the
serving processes, the rest of the machine and the load generator apart (``serving_parts/cpu.py``).

Each ratio is taken within a round (both sides measured minutes apart) and reported as the median over
rounds with its spread; a bar is met only when its worst round meets it. The cascade against the plain
teacher is the algorithm's gain, on its own line. The bars before this comparison (issue 18's, against
the teacher served plainly or by Serve) are printed beside, marked as no longer held. Exit status 1 if a
bar is missed. Models are cached under ``~/.cache/scaleforge/serving-bench``.
"""

import argparse
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "platform"), str(REPO)]

import peers  # noqa: E402
import ray  # noqa: E402
import serving_parts  # noqa: E402
from provenance import check_and_print  # noqa: E402
from serving_parts.common import BATCH, THREADS  # noqa: E402
from serving_parts.deploy import served, shipped, workers_for  # noqa: E402
from serving_parts.load import binary_bodies, bodies, drive  # noqa: E402
from serving_parts.models import calibrated_thresholds, cost_ms, exit_probs, print_exit_curves, trained  # noqa: E402
from serving_parts.plain import plain_server  # noqa: E402
from serving_parts.report import report  # noqa: E402

from scaleforge.data import load_mnist1d  # noqa: E402
from scaleforge.deployment.deploy import python_proxy_url  # noqa: E402
from scaleforge.runtime import SERVE_DIRECT_INGRESS, SERVE_HAPROXY, SERVE_LOW_OVERHEAD  # noqa: E402

INFER = "/v2/models/{}/infer"


def main() -> int:
    check_and_print()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per configuration and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the side that goes first alternating")
    parser.add_argument("--concurrency", type=int, default=8, help="clients in the throughput runs")
    parser.add_argument("--serve-config", type=Path, default=REPO / "configs" / "serve.yaml", help="ours")
    args = parser.parse_args()

    data = load_mnist1d(20_000, 42, 0.2, "~/.cache/scaleforge")
    order = np.random.default_rng(0).permutation(len(data["y_test"]))
    calibration, held_out = order[:2000], order[2000:]
    paths = trained(data)
    costs = {role: cost_ms(paths[role], data["x_test"]) for role in ("student", "teacher")}
    thresholds = calibrated_thresholds(
        exit_probs(paths, data["x_test"][calibration]), data["y_test"][calibration]
    )
    cfg = shipped(args.serve_config, paths, thresholds["cascade"])
    workers, shape = workers_for(cfg.applications[0].args)
    merged = {m.name: m.max_batch_size for m in cfg.applications[0].args.models}  # the same batching
    print(
        f"forward pass of {BATCH} on {THREADS} thread: student {costs['student']:.1f} ms, teacher "
        f"{costs['teacher']:.1f} ms; calibrated thresholds: cascade {thresholds['cascade']:.3f}, early exit "
        f"{thresholds['early exit']:.3f}; {os.cpu_count()} cores"
    )
    serve_env = {**SERVE_DIRECT_INGRESS, **SERVE_LOW_OVERHEAD, **SERVE_HAPROXY}
    settings = ", ".join(f"{k}={os.environ.get(k, v)}" for k, v in serve_env.items())
    print(
        f"ours: {_shown(args.serve_config)}, {shape} ({settings}); plain: uvicorn, {workers} workers",
        flush=True,
    )
    x, y = data["x_test"][held_out], data["y_test"][held_out]
    print_exit_curves(exit_probs(paths, x), y)
    labels = [y[i : i + BATCH] for i in range(0, len(x) - BATCH + 1, BATCH)]
    # Ray ships the bare deployment to its workers by value, as it ships a script's.
    for package in (peers, serving_parts):
        ray.cloudpickle.register_pickle_by_value(package)
    results: dict[str, list[dict]] = {}
    for round_index in range(args.rounds):
        sides = ("ours", "plain") if round_index % 2 == 0 else ("plain", "ours")
        for side in sides:
            if side == "ours":
                with served(cfg, paths["student"]) as (proxy, direct):
                    runs = our_runs(proxy, direct, x, args.concurrency)
                    measure(runs, labels, args, round_index, results)
            else:
                with plain_server(paths, thresholds["cascade"], workers, merged) as plain:
                    measure(plain_runs(plain, x, args.concurrency), labels, args, round_index, results)
    return report(results, args)


def _shown(path: Path) -> Path:
    path = path.resolve()
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def our_runs(proxy: str, direct: list[str], x: np.ndarray, c: int) -> dict:
    """Our configurations: name -> (base URLs, requests, clients)."""
    cascade, teacher = INFER.format("cascade"), INFER.format("teacher")
    python_proxy = {}
    if fallback := python_proxy_url():  # Serve's Python proxy: HAProxy's fallback
        python_proxy = {"cascade via Serve's Python proxy": ([fallback], bodies(cascade, x, c), c)}
    return {
        "cascade, direct": (direct, bodies(cascade, x, c), c),
        "cascade via proxy": ([proxy], bodies(cascade, x, c), c),
        **python_proxy,
        "teacher via proxy": ([proxy], bodies(teacher, x, c), c),
        "cascade, direct, binary": (direct, binary_bodies(cascade, x, c), c),
        "stage 0, direct": (direct, bodies(cascade, x, 1, min_confidence=0.0), 1),
        "stage 0 via proxy": ([proxy], bodies(cascade, x, 1, min_confidence=0.0), 1),
        "bare stage-0 Serve": ([f"{proxy}/bare"], bodies(INFER.format("student"), x, 1), 1),
    }


def plain_runs(plain: str, x: np.ndarray, c: int) -> dict:
    """The plain server's configurations."""
    cascade, teacher = INFER.format("cascade"), INFER.format("teacher")
    return {
        "plain cascade": ([plain], bodies(cascade, x, c), c),
        "plain teacher": ([plain], bodies(teacher, x, c), c),
        "plain teacher, binary": ([plain], binary_bodies(teacher, x, c), c),
        "plain stage 0": ([plain], bodies(cascade, x, 1, min_confidence=0.0), 1),
    }


def measure(runs: dict, labels: list[np.ndarray], args, round_index: int, results: dict) -> None:
    """Every configuration of one side once, in turn, appended to ``results`` (one entry per round)."""
    for name, (urls, requests, clients) in runs.items():
        result = drive(urls, requests, labels, clients, args.seconds)
        results.setdefault(name, []).append(result | {"clients": clients})
        print(
            f"  round {round_index + 1} {name:24s} c={clients}: {result['throughput']:7,.0f} inputs/s, "
            f"p50 {result['p50']:6.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
