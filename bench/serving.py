"""Serving benchmark, side by side in one run: teacher-only deployment against the cascade.

    .venv/bin/python bench/serving.py [--concurrency 8] [--seconds 15] [--rounds 2]

Every configuration is a real Serve app on this machine's local Ray, driven over HTTP at the same
fixed concurrency with V2 infer requests of 64 MNIST-1D held-out inputs:

1. teacher only (one wide CNN deployment behind the V2 ingress);
2. the cascade (small CNN, then the teacher) with thresholds calibrated like ``jobs.calibrate``
   (at most 0.5 point below the teacher) on the other half of the held-out split;
3. the cascade with every input stopping at stage 0 (``min_confidence=0``), against
4. a bare Serve deployment of the stage-0 model (model and HTTP handling in one replica).

Models are trained once and cached under ``~/.cache/scaleforge/serving-bench``.
"""

import argparse
import asyncio
import json
import socket
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "platform"), str(Path(__file__).resolve().parents[1])]

import ray  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from ray import serve  # noqa: E402

from scaleforge.artifacts.servable import load_servable  # noqa: E402
from scaleforge.data import load_mnist1d  # noqa: E402
from scaleforge.models import CNN1dSpec  # noqa: E402
from scaleforge.quickfit import fit_and_save  # noqa: E402
from scaleforge.routing import calibrate_thresholds  # noqa: E402
from serving.app import build_app  # noqa: E402
from serving.protocol import ProtocolError, V2Response, infer_response, parse_infer_request  # noqa: E402

CACHE = Path("~/.cache/scaleforge/serving-bench").expanduser()
STUDENT = CNN1dSpec(channels=[16, 32], hidden=64, pool=True)
# Wide and unpooled so that one batch of 64 costs well over 10 ms on a CPU core: the benchmark
# then measures model cost, not framework overhead.
TEACHER = CNN1dSpec(channels=[96, 192, 192], hidden=256)
BATCH = 64

bare_api = FastAPI()


@serve.deployment
@serve.ingress(bare_api)
class BareModel:
    """The stage-0 model and the V2 request handling in one replica: the latency floor."""

    def __init__(self, artifact: str):
        torch.set_num_threads(1)
        self.model = load_servable(artifact)

    @bare_api.post("/v2/models/{name}/infer")
    async def infer(self, name: str, request: Request) -> V2Response:
        try:
            parsed = parse_infer_request(await request.body(), self.model.input_dim, 4096)
        except ProtocolError as err:
            return JSONResponse({"error": err.message}, status_code=err.status)
        with torch.inference_mode():
            probs = self.model.module(torch.from_numpy(parsed.x)).softmax(dim=1).numpy()
        outputs = {"class": probs.argmax(axis=1).astype(np.int64), "probabilities": probs}
        return V2Response(infer_response(name, parsed.id, outputs, None))


def trained(data) -> dict[str, str]:
    paths = {}
    for role, spec, epochs in (("student", STUDENT, 6), ("teacher", TEACHER, 3)):
        path = CACHE / role
        if not (path / "manifest.json").is_file():
            print(f"training the {role} (cached in {path}) ...", flush=True)
            fit_and_save(path, spec, data, epochs=epochs)
        paths[role] = str(path)
    return paths


def teacher_cost_ms(path: str, x: np.ndarray) -> float:
    torch.set_num_threads(1)
    model = load_servable(path).module
    batch = torch.from_numpy(x[:BATCH])
    with torch.inference_mode():
        model(batch)
        times = []
        for _ in range(10):
            start = time.perf_counter()
            model(batch)
            times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def calibrated_threshold(paths, x, y) -> float:
    with torch.inference_mode():
        probs = [load_servable(paths[r]).module(torch.from_numpy(x)).softmax(1) for r in ("student", "teacher")]
    labels = torch.from_numpy(y)
    teacher = float((probs[1].argmax(1) == labels).float().mean())
    return calibrate_thresholds(probs, labels, "max_prob", target_accuracy=teacher - 0.005, safety_sd=2.0)[0]


def deploy(paths: dict[str, str], threshold: float) -> None:
    model = {"num_cpus": 0.1, "max_batch_size": 8, "max_ongoing_requests": 32, "max_queued_requests": -1}
    ingress = {"num_cpus": 0.1, "max_ongoing_requests": 64, "max_queued_requests": -1}
    teacher_only = {"models": [{"name": "teacher", "artifact": paths["teacher"], **model}], "ingress": ingress}
    cascade = {"models": [{"name": r, "artifact": paths[r], **model} for r in ("student", "teacher")],
               "cascades": [{"name": "cascade", "stages": [{"model": "student", "threshold": threshold},
                                                            {"model": "teacher"}]}], "ingress": ingress}
    serve.run(build_app(teacher_only), name="teacher-only", route_prefix="/teacher-only")
    serve.run(build_app(cascade), name="cascade", route_prefix="/cascade")
    serve.run(BareModel.options(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=64).bind(paths["student"]),
              name="bare", route_prefix="/bare")


def bodies(x: np.ndarray, **parameters) -> list[bytes]:
    return [json.dumps({"inputs": [{"name": "input", "shape": [BATCH, x.shape[1]], "datatype": "FP32",
                                    "data": x[i:i + BATCH].ravel().tolist()}], "parameters": parameters}).encode()
            for i in range(0, len(x) - BATCH + 1, BATCH)]


async def drive(url: str, requests: list[bytes], labels: list[np.ndarray], concurrency: int, seconds: float) -> dict:
    """Closed loop: ``concurrency`` clients, each sending its next request when the last returns."""
    latencies, correct, failures = [], 0, 0
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await client.post(url, content=requests[0], headers={"content-type": "application/json"})  # warm-up
        deadline = time.perf_counter() + seconds

        async def worker(offset: int):
            nonlocal correct, failures
            index = offset
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                response = await client.post(url, content=requests[index % len(requests)],
                                             headers={"content-type": "application/json"})
                latencies.append(time.perf_counter() - start)
                if response.status_code != 200:
                    failures += 1
                else:
                    predicted = np.asarray(response.json()["outputs"][0]["data"])
                    correct += int((predicted == labels[index % len(requests)]).sum())
                index += concurrency

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - start
    done = len(latencies) - failures
    return {"throughput": done * BATCH / elapsed, "p50": 1e3 * np.percentile(latencies, 50),
            "p99": 1e3 * np.percentile(latencies, 99), "accuracy": correct / max(done * BATCH, 1),
            "requests": len(latencies), "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds; medians are reported")
    args = parser.parse_args()

    data = load_mnist1d(20_000, 42, 0.2, "~/.cache/scaleforge")
    order = np.random.default_rng(0).permutation(len(data["y_test"]))
    calibration, held_out = order[:2000], order[2000:]
    paths = trained(data)
    cost = teacher_cost_ms(paths["teacher"], data["x_test"])
    threshold = calibrated_threshold(paths, data["x_test"][calibration], data["y_test"][calibration])
    print(f"teacher cost per batch of {BATCH}: {cost:.1f} ms (one thread); calibrated threshold {threshold:.3f}")

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    deploy(paths, threshold)
    base = f"http://127.0.0.1:{port}"
    x, y = data["x_test"][held_out], data["y_test"][held_out]
    labels = [y[i:i + BATCH] for i in range(0, len(x) - BATCH + 1, BATCH)]
    runs = {
        "teacher only": (f"{base}/teacher-only/v2/models/teacher/infer", bodies(x)),
        "cascade (calibrated)": (f"{base}/cascade/v2/models/cascade/infer", bodies(x)),
        "cascade, all stop at stage 0": (f"{base}/cascade/v2/models/cascade/infer", bodies(x, min_confidence=0.0)),
        "stage-0 model, bare deployment": (f"{base}/bare/v2/models/student/infer", bodies(x)),
    }
    results: dict[str, list[dict]] = {name: [] for name in runs}
    for round_index in range(args.rounds):
        for name, (url, requests) in runs.items():
            results[name].append(asyncio.run(drive(url, requests, labels, args.concurrency, args.seconds)))
            print(f"  round {round_index + 1} {name}: {results[name][-1]['throughput']:,.0f} inputs/s", flush=True)
    report(results, args)
    serve.shutdown()
    ray.shutdown()


def report(results: dict[str, list[dict]], args) -> None:
    med = {name: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for name, rs in results.items()}
    print(f"\nconcurrency {args.concurrency}, requests of {BATCH} inputs, {args.seconds:g} s x {args.rounds} rounds "
          "(medians)")
    print(f"{'configuration':32s} {'inputs/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'accuracy':>9s} {'failed':>7s}")
    for name, m in med.items():
        print(f"{name:32s} {m['throughput']:9,.0f} {m['p50']:8.1f} {m['p99']:8.1f} {m['accuracy']:9.4f} "
              f"{int(m['failures']):7d}")
    speedup = med["cascade (calibrated)"]["throughput"] / med["teacher only"]["throughput"]
    latency = med["cascade, all stop at stage 0"]["p50"] / med["stage-0 model, bare deployment"]["p50"]
    print(f"cascade / teacher-only throughput: {speedup:.2f}x (target >= 1.5)")
    print(f"cascade at stage 0 / bare stage-0 p50 latency: {latency:.2f}x (target <= 1.5)")
    print(f"accuracy: cascade {med['cascade (calibrated)']['accuracy']:.4f}, teacher {med['teacher only']['accuracy']:.4f}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    main()
