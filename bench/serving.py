"""Serving at equal model CPU, in one run: the cascade against teacher-only Ray Serve, a bare
``@serve.batch`` stage-0 deployment, and a plain FastAPI + uvicorn server (bench/plain_server.py).

    .venv/bin/python bench/serving.py [--seconds 15] [--rounds 2]
    (about 6 minutes on 2 idle cores, plus training both models once; --seconds 3 --rounds 1: 2 minutes)

Every server listens on 127.0.0.1 and gets V2 JSON infer requests of 64 MNIST-1D inputs from
closed-loop clients. Model CPU is the same everywhere: two processes with one torch thread each
(the cascade's ingress, which runs the student in place, and its teacher replica; the teacher-only
app's two teacher replicas; uvicorn's two workers, one per core here); the teacher-only app also
runs an ingress replica, and every Serve app Serve's proxy.

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
import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "platform"), str(REPO)]

import ray  # noqa: E402
from bars import print_bars  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from ray import serve  # noqa: E402
from ray.serve.context import _get_global_client  # noqa: E402

from scaleforge.artifacts.servable import load_servable  # noqa: E402
from scaleforge.config.serve import ModelEntry  # noqa: E402
from scaleforge.data import load_mnist1d  # noqa: E402
from scaleforge.deployment.deploy import direct_ingress_urls  # noqa: E402
from scaleforge.models import CNN1dSpec  # noqa: E402
from scaleforge.models.early_exit import EarlyExitCNN1d, joint_loss  # noqa: E402
from scaleforge.quickfit import fit, fit_and_save  # noqa: E402
from scaleforge.routing import calibrate_thresholds, simulate_cascade  # noqa: E402
from scaleforge.runtime import SERVE_DIRECT_INGRESS  # noqa: E402
from serving.app import build_app  # noqa: E402
from serving.binary import HEADER  # noqa: E402
from serving.models import split_like  # noqa: E402
from serving.protocol import (  # noqa: E402
    SERVER_TIMING,
    ProtocolError,
    infer_response,
    parse_infer_request,
    parse_server_timing,
    render,
)

CACHE = Path("~/.cache/scaleforge/serving-bench").expanduser()
STUDENT = CNN1dSpec(channels=[16, 32], hidden=64, pool=True)
# Wide and unpooled so that one batch of 64 costs well over 10 ms on a CPU core: the benchmark
# then measures model cost, not framework overhead.
TEACHER = CNN1dSpec(channels=[96, 192, 192], hidden=256)
EXIT_AFTER = 1  # the early-exit network: the teacher with a side exit after its first conv block
BATCH = 64
THREADS = ModelEntry.model_fields["threads"].default  # torch threads per model process, everywhere
MODEL_PROCESSES = 2  # the cascade's two model replicas; the teacher-only app and uvicorn get as many
SERVE_ENV = {**SERVE_DIRECT_INGRESS, "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}
"""Serve's low-overhead settings, read by its controller and replicas when they start (set before
``ray.init``)."""
MAX_BATCH_SIZE = ModelEntry.model_fields["max_batch_size"].default
BATCH_WAIT_S = ModelEntry.model_fields["batch_wait_timeout_s"].default  # both as our model deployments

bare_api = FastAPI()


@serve.deployment
@serve.ingress(bare_api)
class BareModel:
    """The stage-0 model as a Ray Serve user writes it: V2 handling and ``@serve.batch`` in one replica."""

    def __init__(self, artifact: str):
        torch.set_num_threads(THREADS)
        self.model = load_servable(artifact)

    @bare_api.post("/v2/models/{name}/infer")
    async def infer(self, name: str, request: Request):
        try:
            parsed = parse_infer_request(
                await request.body(), self.model.input_dim, 1024, request.headers.get(HEADER)
            )
        except ProtocolError as err:
            return JSONResponse({"error": err.message}, status_code=err.status)
        probs = await self.predict(parsed.x)
        outputs = {"class": probs.argmax(axis=1).astype(np.int64), "probabilities": probs}
        return render(infer_response(name, parsed.id, outputs, None), parsed)

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
    async def predict(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            probs = self.model.module(torch.from_numpy(np.concatenate(batches))).softmax(dim=1).numpy()
        return split_like(batches, probs)


def load_early_exit(path: str) -> EarlyExitCNN1d:
    model = EarlyExitCNN1d(TEACHER, 40, 10, exit_after=EXIT_AFTER)
    model.load_state_dict(load_file(Path(path) / "model.safetensors"))
    return model.eval()


early_api = FastAPI()  # (a deployment's class is captured as it is declared: what it calls comes first)


@serve.deployment
@serve.ingress(early_api)
class EarlyExitServer:
    """The early-exit network served as one cascade: V2 handling, ``@serve.batch`` and
    ``EarlyExitCNN1d.predict`` in one replica (only the rows its side exit hands on run the rest)."""

    def __init__(self, path: str, threshold: float):
        torch.set_num_threads(THREADS)
        self.model, self.threshold = load_early_exit(path), threshold

    @early_api.post("/v2/models/{name}/infer")
    async def infer(self, name: str, request: Request):
        try:
            parsed = parse_infer_request(await request.body(), 40, 1024, request.headers.get(HEADER))
        except ProtocolError as err:
            return JSONResponse({"error": err.message}, status_code=err.status)
        probs = await self.predict(parsed.x)
        outputs = {"class": probs.argmax(axis=1).astype(np.int64), "probabilities": probs}
        return render(infer_response(name, parsed.id, outputs, None), parsed)

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=0.0)
    async def predict(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        answer = self.model.predict(torch.from_numpy(np.concatenate(batches)), self.threshold)
        return split_like(batches, answer.probs.numpy())


def trained(data) -> dict[str, str]:
    paths = {}
    for role, spec, epochs in (("student", STUDENT, 6), ("teacher", TEACHER, 3)):
        path = CACHE / role
        if not (path / "manifest.json").is_file():
            print(f"training the {role} (cached in {path}) ...", file=sys.stderr, flush=True)
            fit_and_save(path, spec, data, epochs=epochs)
        paths[role] = str(path)
    path = CACHE / f"early-exit-{EXIT_AFTER}"
    if not (path / "model.safetensors").is_file():
        print(f"training the early-exit network (cached in {path}) ...", file=sys.stderr, flush=True)
        torch.manual_seed(0)  # as fit_and_save trains the teacher, with the joint loss of both exits
        model = fit(
            EarlyExitCNN1d(TEACHER, 40, 10, exit_after=EXIT_AFTER),
            data["x"],
            data["y"],
            epochs=3,
            batch_size=256,
            lr=3e-3,
            weight_decay=1e-4,
            one_cycle=True,
            loss=joint_loss,
        )
        path.mkdir(parents=True, exist_ok=True)
        save_file(model.state_dict(), str(path / "model.safetensors.tmp"))
        os.replace(path / "model.safetensors.tmp", path / "model.safetensors")
    paths["early-exit"] = str(path)
    return paths


def cost_ms(path: str, x: np.ndarray) -> float:
    """Median forward time of one batch of ``BATCH`` on one thread."""
    torch.set_num_threads(THREADS)
    model, batch = load_servable(path).module, torch.from_numpy(x[:BATCH])
    times = []
    with torch.inference_mode():
        for _ in range(11):
            start = time.perf_counter()
            model(batch)
            times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times[1:]))


def exit_probs(paths, x: np.ndarray) -> dict[str, list[torch.Tensor]]:
    """Both stages' probabilities for every input: the two-model cascade's (student, teacher) and
    the early-exit network's (side exit, final exit)."""
    inputs = torch.from_numpy(x)
    with torch.inference_mode():
        cascade = [load_servable(paths[r]).module(inputs).softmax(1) for r in ("student", "teacher")]
        early = [logits.softmax(1) for logits in load_early_exit(paths["early-exit"]).exit_logits(inputs)]
    return {"cascade": cascade, "early exit": early}


def calibrated_thresholds(probs: dict[str, list[torch.Tensor]], y: np.ndarray) -> dict[str, float]:
    """Each cascade's threshold, calibrated like ``jobs.calibrate``: 0.5 point below the teacher (or
    below its own last stage, where that is lower)."""
    labels = torch.from_numpy(y)
    last = {name: float((stages[1].argmax(1) == labels).float().mean()) for name, stages in probs.items()}
    return {
        name: calibrate_thresholds(
            stages,
            labels,
            "max_prob",
            safety_sd=2.0,
            target_accuracy=min(last["cascade"], last[name]) - 0.005,
        )[0]
        for name, stages in probs.items()
    }


def print_exit_curves(probs: dict[str, list[torch.Tensor]], y: np.ndarray) -> None:
    """Accuracy against the share of inputs answered at the first stage, threshold by threshold (held out)."""
    labels = torch.from_numpy(y)
    print("accuracy / share answered at stage 0 (held out), by threshold on max_prob")
    thresholds = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99, 1.01)
    print(f"  {'threshold':24s}" + "".join(f"{t:>14g}" for t in thresholds))
    for name, stages in probs.items():
        cells = []
        for threshold in thresholds:
            result = simulate_cascade(stages, [threshold], "max_prob")
            cells.append(
                f"{float((result.predictions == labels).float().mean()):.4f} / {result.answered_at(0):4.0%}"
            )
        print(f"  {name:24s}" + "".join(f"{cell:>14s}" for cell in cells))


def deploy(paths: dict[str, str], thresholds: dict[str, float]) -> None:
    threshold = thresholds["cascade"]
    model = {"num_cpus": 0.1, "threads": THREADS, "max_ongoing_requests": 32, "max_queued_requests": -1}
    ingress = {"num_cpus": 0.1, "max_ongoing_requests": 64, "max_queued_requests": -1}
    teacher = {"name": "teacher", "artifact": paths["teacher"], **model}
    teacher_only = {"models": [{**teacher, "replicas": MODEL_PROCESSES}], "ingress": ingress}
    # The student runs in the ingress with no batching wait: a request of 64 rows is a batch already,
    # and requests that arrive while it runs are merged all the same.
    student = {"name": "student", "artifact": paths["student"], **model, "batch_wait_timeout_s": 0.0}
    cascade = {
        "models": [{**student, "in_ingress": True}, teacher],
        "routers": [
            {
                "kind": "cascade",
                "name": "cascade",
                "stages": [{"model": "student", "threshold": threshold}, {"model": "teacher"}],
            }
        ],
        "ingress": ingress,
    }
    separate = {**cascade, "models": [student, teacher]}
    serve.run(build_app(teacher_only), name="teacher-only", route_prefix="/teacher-only")
    serve.run(build_app(cascade), name="cascade", route_prefix="/cascade")
    serve.run(build_app(separate), name="cascade-2-deployments", route_prefix="/cascade-2-deployments")
    serve.run(
        BareModel.options(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=64).bind(
            paths["student"]
        ),
        name="bare",
        route_prefix="/bare",
    )
    serve.run(
        EarlyExitServer.options(
            ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=64, num_replicas=MODEL_PROCESSES
        ).bind(paths["early-exit"], thresholds["early exit"]),
        name="early-exit",
        route_prefix="/early-exit",
    )


@contextlib.contextmanager
def plain_server(artifact: str, name: str):
    """bench/plain_server.py under uvicorn (``MODEL_PROCESSES`` workers) on a free port: yields its URL."""
    port = _free_port()
    env = {**os.environ, "PLAIN_ARTIFACT": artifact, "PLAIN_MODEL": name}
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "plain_server:app",
        "--app-dir",
        str(REPO / "bench"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(MODEL_PROCESSES),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(f"{base}/v2/health/ready", process)
        yield f"{base}/v2/models/{name}/infer"
    finally:
        process.terminate()  # uvicorn's supervisor stops its workers
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 120) -> None:
    """Poll ``url`` until every worker has answered (a worker answers once its model is loaded)."""
    deadline, workers = time.monotonic() + timeout_s, set()
    while len(workers) < MODEL_PROCESSES:
        if process.poll() is not None:
            raise RuntimeError(f"uvicorn exited with status {process.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"uvicorn at {url}: {len(workers)} of {MODEL_PROCESSES} workers ready after {timeout_s:.0f} s"
            )
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            workers.add(httpx.get(url, timeout=2).json()["pid"])
        time.sleep(0.05)


def bodies(x: np.ndarray, **parameters) -> list[tuple[bytes, dict]]:
    """Requests of ``BATCH`` rows as V2 JSON, with their headers."""
    return [
        (
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": "input",
                            "shape": [BATCH, x.shape[1]],
                            "datatype": "FP32",
                            "data": x[i : i + BATCH].ravel().tolist(),
                        }
                    ],
                    "parameters": parameters,
                }
            ).encode(),
            {"content-type": "application/json"},
        )
        for i in range(0, len(x) - BATCH + 1, BATCH)
    ]


def binary_bodies(x: np.ndarray, **parameters) -> list[tuple[bytes, dict]]:
    """The same requests with the binary tensor extension, every output asked for as binary data."""
    requests = []
    for i in range(0, len(x) - BATCH + 1, BATCH):
        raw = np.ascontiguousarray(x[i : i + BATCH], dtype="<f4").tobytes()
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "input",
                        "shape": [BATCH, x.shape[1]],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": len(raw)},
                    }
                ],
                "parameters": {**parameters, "binary_data_output": True},
            }
        ).encode()
        requests.append(
            (header + raw, {"content-type": "application/octet-stream", HEADER: str(len(header))})
        )
    return requests


def predicted_classes(response: httpx.Response) -> np.ndarray:
    """The ``class`` output (the first) of a V2 response, JSON or binary."""
    if HEADER.lower() not in response.headers:
        return np.asarray(response.json()["outputs"][0]["data"])
    length = int(response.headers[HEADER])
    first = json.loads(response.content[:length])["outputs"][0]
    return np.frombuffer(response.content[length : length + first["parameters"]["binary_data_size"]], "<i8")


async def drive(
    url: str | list[str],
    requests: list[tuple[bytes, dict]],
    labels: list[np.ndarray],
    concurrency: int,
    seconds: float,
) -> dict:
    """Closed loop: ``concurrency`` clients, each sending its next request when the last returns.

    ``url``: one, or one per replica (direct ingress gives each replica a port of its own): the
    clients are spread over them in turn, as a load balancer over Serve's target group spreads them.

    Several clients open a connection per request: uvicorn's workers share one listening socket, and
    8 kept-alive connections often all land on the worker that woke first, idling the other core.
    One client keeps its connection. Accuracy counts each distinct request once (inputs weigh alike).
    """
    latencies, hops, correct, failures = [], [], {}, 0
    closing = {"connection": "close"} if concurrency > 1 else {}
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        urls = [url] if isinstance(url, str) else url
        await asyncio.gather(
            *(
                client.post(urls[i % len(urls)], content=requests[i][0], headers=requests[i][1] | closing)
                for i in range(concurrency)
            )
        )
        deadline = time.perf_counter() + seconds

        async def worker(offset: int):
            nonlocal failures
            index = offset
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                body, headers = requests[index % len(requests)]
                response = await client.post(
                    urls[offset % len(urls)], content=body, headers=headers | closing
                )
                latencies.append(time.perf_counter() - start)
                timing = parse_server_timing(response.headers.get(SERVER_TIMING, ""))
                if {"ingress", "model"} <= set(timing):  # our ingress says where its time went
                    hops.append(
                        (
                            1e3 * latencies[-1] - timing["ingress"],
                            timing["ingress"] - timing["model"],
                            timing["model"],
                        )
                    )
                if response.status_code != 200:
                    failures += 1
                else:
                    predicted = predicted_classes(response)
                    correct[index % len(requests)] = int((predicted == labels[index % len(requests)]).sum())
                index += concurrency

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - start
    done = len(latencies) - failures
    proxy, ingress, model = np.median(hops, axis=0) if hops else (math.nan,) * 3
    return {
        "throughput": done * BATCH / elapsed,
        "p50": 1e3 * np.percentile(latencies, 50),
        "p99": 1e3 * np.percentile(latencies, 99),
        "failures": failures,
        "accuracy": sum(correct.values()) / max(len(correct) * BATCH, 1),
        "proxy_ms": proxy,
        "ingress_ms": ingress,
        "model_ms": model,
    }


def main() -> int:
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
        "replicas and an ingress; cascade 1 ingress running the student + 1 teacher replica; "
        "cascade, 2 deployments: "
        f"1 student + 1 teacher replica and an ingress; early exit {MODEL_PROCESSES} replicas, each its own "
        f"ingress; uvicorn {MODEL_PROCESSES} workers; bare stage-0 Serve 1 replica (every Serve app also has "
        "Serve's HTTP proxy)",
        flush=True,
    )
    print_exit_curves(exit_probs(paths, x), y)
    labels = [y[i : i + BATCH] for i in range(0, len(x) - BATCH + 1, BATCH)]
    results: dict[str, list[dict]] = {}
    os.environ.update(SERVE_ENV)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        deploy(paths, thresholds)
        base = f"http://127.0.0.1:{port}"
        direct = direct_ingress_urls(_get_global_client().get_serve_details())
        cascade, split = f"{direct['cascade'][0]}/v2/models/cascade/infer", "cascade-2-deployments"
        early = [f"{url}/v2/models/early-exit/infer" for url in direct["early-exit"]]  # a port per replica
        with (
            plain_server(paths["teacher"], "teacher") as uvicorn_teacher,
            plain_server(paths["student"], "student") as uvicorn_student,
        ):
            c, one = args.concurrency, 1
            runs = {  # name: (url, requests, clients)
                "teacher-only Serve": (f"{base}/teacher-only/v2/models/teacher/infer", bodies(x), c),
                "cascade via proxy": (f"{base}/cascade/v2/models/cascade/infer", bodies(x), c),
                "cascade, direct": (cascade, bodies(x), c),
                "cascade, 2 deployments, direct": (
                    f"{direct[split][0]}/v2/models/cascade/infer",
                    bodies(x),
                    c,
                ),
                "early exit, direct": (early, bodies(x), c),
                "uvicorn teacher": (uvicorn_teacher, bodies(x), c),
                "cascade, direct, binary": (cascade, binary_bodies(x), c),
                "uvicorn, binary tensors": (uvicorn_teacher, binary_bodies(x), c),
                "stage 0 via proxy": (
                    f"{base}/cascade/v2/models/cascade/infer",
                    bodies(x, min_confidence=0.0),
                    one,
                ),
                "stage 0, direct": (cascade, bodies(x, min_confidence=0.0), one),
                "bare stage-0 Serve": (f"{base}/bare/v2/models/student/infer", bodies(x), one),
                "uvicorn stage 0": (uvicorn_student, bodies(x), one),
            }
            for round_index in range(args.rounds):
                for name, (url, requests, clients) in runs.items():
                    result = asyncio.run(drive(url, requests, labels, clients, args.seconds))
                    results.setdefault(name, []).append(result | {"clients": clients})
                    print(
                        f"  round {round_index + 1} {name:30s} c={clients}: "
                        f"{result['throughput']:7,.0f} inputs/s, p50 {result['p50']:6.1f} ms",
                        flush=True,
                    )
    finally:
        ray.shutdown()  # the local cluster and Serve with it
    return report(results, args)


def report(results: dict[str, list[dict]], args) -> int:
    med = {name: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for name, rs in results.items()}
    print(f"\nrequests of {BATCH} inputs, {args.seconds:g} s x {args.rounds} rounds (medians)")
    print(
        f"{'configuration':30s} {'clients':>7s} {'inputs/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} "
        f"{'accuracy':>9s} {'failed':>7s}"
    )
    for name, m in med.items():
        print(
            f"{name:30s} {int(m['clients']):7d} {m['throughput']:9,.0f} {m['p50']:8.1f} {m['p99']:8.1f} "
            f"{m['accuracy']:9.4f} {int(m['failures']):7d}"
        )
    print()

    def ratio(key: str, ours: str, theirs: str, bar: float, at_least: bool) -> tuple:
        a, b = med[ours][key], med[theirs][key]
        shown = f"{a:,.0f} / {b:,.0f} inputs/s" if key == "throughput" else f"{a:.1f} / {b:.1f} ms"
        met = a / b >= bar if at_least else a / b <= bar
        return f"{a / b:.2f}x ({shown})", f"{'>=' if at_least else '<='} {bar}x", met

    cascade, teacher = med["cascade, direct"]["accuracy"], med["teacher-only Serve"]["accuracy"]
    failed = sum(int(r["failures"]) for rs in results.values() for r in rs)
    c = args.concurrency
    rows = [
        (
            f"cascade, direct / uvicorn teacher, c={c}",
            *ratio("throughput", "cascade, direct", "uvicorn teacher", 2.0, True),
        ),
        (
            f"cascade, direct / uvicorn teacher, binary tensors, c={c}",
            *ratio("throughput", "cascade, direct, binary", "uvicorn, binary tensors", 2.0, True),
        ),
        (
            "stage 0, direct / uvicorn stage 0, p50 c=1",
            *ratio("p50", "stage 0, direct", "uvicorn stage 0", 2.0, False),
        ),
        (
            f"cascade via proxy / teacher-only Serve, c={c}",
            *ratio("throughput", "cascade via proxy", "teacher-only Serve", 1.5, True),
        ),
        (
            "stage 0 via proxy / bare stage-0 Serve, p50 c=1",
            *ratio("p50", "stage 0 via proxy", "bare stage-0 Serve", 1.3, False),
        ),
        (
            "accuracy, cascade vs teacher (held out)",
            f"{cascade:.4f} vs {teacher:.4f} ({cascade - teacher:+.4f})",
            ">= teacher - 0.005",
            cascade >= teacher - 0.005,
        ),
        ("failed requests, every run", str(failed), "0", failed == 0),
    ]
    # Reported without a bar: what the proxy's hop and the split into deployments cost.
    for ours in ("cascade via proxy", "cascade, 2 deployments, direct", "early exit, direct"):
        shown = ratio("throughput", ours, "uvicorn teacher", 0, True)[0]
        print(f"{ours} / uvicorn teacher, c={c}: {shown}, no bar")
    shown = ratio("throughput", "early exit, direct", "cascade, direct", 0, True)[0]
    print(
        f"early exit, direct / cascade, direct, c={c}: {shown}, accuracy "
        f"{med['early exit, direct']['accuracy']:.4f} against {cascade:.4f}, no bar"
    )
    shown = ratio("p50", "stage 0 via proxy", "uvicorn stage 0", 0, False)[0]
    print(f"stage 0 via proxy / uvicorn stage 0, p50 c=1: {shown}, no bar\n")
    # Where a request's time goes on Serve, from the ingress's Server-Timing header (medians per request):
    # the first hop (the HTTP server, the network and the proxy if any) is what the client waited
    # beyond the ingress's handler.
    print(
        "time per hop, 1 client (ms): HTTP server + network (+ proxy), ingress (parse, route, render), "
        "model (its call)"
    )
    for name, m in med.items():
        if m["clients"] == 1 and not math.isnan(m["ingress_ms"]):
            print(
                f"  {name:30s} {m['proxy_ms']:6.2f} {m['ingress_ms']:6.2f} {m['model_ms']:6.2f}   "
                f"of p50 {m['p50']:.2f}"
            )
    print()
    return print_bars(rows, "comparison")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
