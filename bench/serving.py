"""Serving at equal model CPU, in one run: the cascade against teacher-only Ray Serve, a bare
``@serve.batch`` stage-0 deployment, and a plain FastAPI + uvicorn server (bench/peers/plain_server.py).

    .venv/bin/python bench/serving.py [--seconds 15] [--rounds 2]
    (about 6 minutes on 2 idle cores, plus training both models once; --seconds 3 --rounds 1: 2 minutes)

Every server listens on 127.0.0.1 and gets V2 JSON infer requests of 64 MNIST-1D inputs from
closed-loop clients (the library's load generator, the query stage's: ``scaleforge.pipeline.load``).
Model CPU is the same everywhere: two processes with one torch thread each (the cascade's ingress,
which runs the student in place, and its teacher replica; the teacher-only app's two teacher
replicas; uvicorn's two workers, one per core here); the teacher-only app also runs an ingress
replica, and every Serve app Serve's proxy.

Serve runs as its own docs set it up for low overhead (Ray 2.60's ``ray/serve/_private/constants.py``):
``RAY_SERVE_ENABLE_DIRECT_INGRESS=1``, so that each app's ingress replica also listens for HTTP on a
port of its own (30000 and up, on ``http_options.host``) beside the proxy, and
``RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0``, so that a replica runs our code on its own event
loop. Each app is driven through the proxy (``via proxy``) or at its ingress replica's port
(``direct``), both in the same run, so the proxy's cost shows.

Throughput, 8 clients:
  teacher-only Serve    the teacher, 2 replicas, behind the V2 ingress, via proxy;
  cascade ...           student (``in_ingress``: run inside the ingress, no batching wait) then
                        teacher, 1 replica; threshold calibrated like ``jobs.calibrate`` (0.5 point
                        below the teacher) on half of the test split; via proxy and direct;
  cascade, 2 deployments, direct  the same with the student as a deployment of its own, as
                        ``configs/serve.yaml`` runs it (no bar: shows what the split costs);
  early exit, direct    the teacher's architecture with a side exit after its first conv block,
                        trained on both exits' joint loss (BranchyNet), served as one cascade
                        (``EarlyExitCNN1d.predict``) by 2 replicas, each its own ingress, the clients
                        spread over their ports; threshold calibrated as the cascade's (no bar);
  uvicorn teacher       the teacher, 2 workers: same loader, V2 parsing and orjson responses;
  ..., binary tensors   the cascade and uvicorn with the V2 binary tensor extension both ways
                        (raw float32 inputs, raw int64/float32 outputs, as tritonclient sends them).
p50 latency, 1 client, every input answered by the stage-0 model:
  cascade at stage 0    the cascade with ``min_confidence=0``, via proxy and direct;
  bare stage-0 Serve    one deployment, FastAPI ingress and ``@serve.batch`` as our model deployments;
  uvicorn stage 0       the stage-0 model, 2 workers.
Time per hop at 1 client, from the ingress's ``Server-Timing`` header: the proxy's hop (what the
client waited beyond the ingress's handler: the HTTP server, the network and, via proxy, the proxy),
the ingress's own share (body, checks, parsing, routing, rendering) and the model's call (median per
request).

Before serving, accuracy against the share of inputs answered at stage 0, threshold by threshold,
for the two-model cascade and the early-exit network (held out).

Configurations alternate round by round; medians are reported. Accuracy is scored on the other half
of the test split only. Each ratio is printed beside its bar (met or missed); exit status 1 if one
is missed. Models are cached under ``~/.cache/scaleforge/serving-bench``.
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
from ray import serve  # noqa: E402
from serving_parts.common import BATCH, MODEL_PROCESSES, SERVE_ENV, THREADS  # noqa: E402
from serving_parts.deploy import deploy, direct_urls  # noqa: E402
from serving_parts.load import binary_bodies, bodies, drive  # noqa: E402
from serving_parts.models import calibrated_thresholds, cost_ms, exit_probs, print_exit_curves, trained  # noqa: E402
from serving_parts.plain import free_port, plain_server  # noqa: E402
from serving_parts.report import report  # noqa: E402

from scaleforge.data import load_mnist1d  # noqa: E402

INFER = "/v2/models/{}/infer"


def main() -> int:
    check_and_print()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="per configuration and round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds; medians are reported")
    parser.add_argument("--concurrency", type=int, default=8, help="clients in the throughput runs")
    args = parser.parse_args()

    data = load_mnist1d(20_000, 42, 0.2, "~/.cache/scaleforge")
    order = np.random.default_rng(0).permutation(len(data["y_test"]))
    calibration, held_out = order[:2000], order[2000:]
    paths = trained(data)
    costs = {role: cost_ms(paths[role], data["x_test"]) for role in ("student", "teacher")}
    thresholds = calibrated_thresholds(
        exit_probs(paths, data["x_test"][calibration]), data["y_test"][calibration]
    )
    x, y = data["x_test"][held_out], data["y_test"][held_out]
    print(
        f"forward pass of {BATCH} on {THREADS} thread: student {costs['student']:.1f} ms, teacher "
        f"{costs['teacher']:.1f} ms; calibrated thresholds: cascade {thresholds['cascade']:.3f}, early exit "
        f"{thresholds['early exit']:.3f}; {os.cpu_count()} cores"
    )
    print(
        f"model CPU, {THREADS} torch thread per process: teacher-only Serve {MODEL_PROCESSES} teacher "
        "replicas and an ingress; cascade 1 ingress running the student + 1 teacher replica; cascade, "
        "2 deployments: "
        f"1 student + 1 teacher replica and an ingress; early exit {MODEL_PROCESSES} replicas, each its own "
        f"ingress; uvicorn {MODEL_PROCESSES} workers; bare stage-0 Serve 1 replica (every Serve app also has "
        "Serve's HTTP proxy)",
        flush=True,
    )
    print_exit_curves(exit_probs(paths, x), y)
    labels = [y[i : i + BATCH] for i in range(0, len(x) - BATCH + 1, BATCH)]
    os.environ.update(SERVE_ENV)
    # Ray ships the benchmark's own deployments to its workers by value, as it ships a script's.
    for package in (peers, serving_parts):
        ray.cloudpickle.register_pickle_by_value(package)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        deploy(paths, thresholds)
        with (
            plain_server(paths["teacher"], "teacher") as uvicorn_teacher,
            plain_server(paths["student"], "student") as uvicorn_student,
        ):
            runs = configurations(f"http://127.0.0.1:{port}", uvicorn_teacher, uvicorn_student, x, args)
            results = measure(runs, labels, args)
    finally:
        ray.shutdown()  # the local cluster and Serve with it
    return report(results, args)


def configurations(base: str, uvicorn_teacher: str, uvicorn_student: str, x: np.ndarray, args) -> dict:
    """Every configuration measured: name -> (base URLs, requests, clients)."""
    direct = direct_urls()
    cascade, split, early = direct["cascade"][:1], direct["cascade-2-deployments"][:1], direct["early-exit"]
    proxy = {app: [f"{base}/{app}"] for app in ("teacher-only", "cascade", "bare")}
    c, one = args.concurrency, 1
    teacher, student, cascaded = INFER.format("teacher"), INFER.format("student"), INFER.format("cascade")
    return {
        "teacher-only Serve": (proxy["teacher-only"], bodies(teacher, x, c), c),
        "cascade via proxy": (proxy["cascade"], bodies(cascaded, x, c), c),
        "cascade, direct": (cascade, bodies(cascaded, x, c), c),
        "cascade, 2 deployments, direct": (split, bodies(cascaded, x, c), c),
        "early exit, direct": (early, bodies(INFER.format("early-exit"), x, c), c),  # a port per replica
        "uvicorn teacher": ([uvicorn_teacher], bodies(teacher, x, c), c),
        "cascade, direct, binary": (cascade, binary_bodies(cascaded, x, c), c),
        "uvicorn, binary tensors": ([uvicorn_teacher], binary_bodies(teacher, x, c), c),
        "stage 0 via proxy": (proxy["cascade"], bodies(cascaded, x, one, min_confidence=0.0), one),
        "stage 0, direct": (cascade, bodies(cascaded, x, one, min_confidence=0.0), one),
        "bare stage-0 Serve": (proxy["bare"], bodies(student, x, one), one),
        "uvicorn stage 0": ([uvicorn_student], bodies(student, x, one), one),
    }


def measure(runs: dict, labels: list[np.ndarray], args) -> dict[str, list[dict]]:
    """Every configuration once a round, in turn, for ``args.rounds`` rounds."""
    results: dict[str, list[dict]] = {}
    for round_index in range(args.rounds):
        for name, (urls, requests, clients) in runs.items():
            result = drive(urls, requests, labels, clients, args.seconds)
            results.setdefault(name, []).append(result | {"clients": clients})
            print(
                f"  round {round_index + 1} {name:30s} c={clients}: {result['throughput']:7,.0f} inputs/s, "
                f"p50 {result['p50']:6.1f} ms",
                flush=True,
            )
    return results


if __name__ == "__main__":
    sys.exit(main())
