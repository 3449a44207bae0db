"""The requests bench/serving.py sends and what it measures of their answers, driven by the library's
closed-loop load generator (:func:`scaleforge.pipeline.load.closed_loop`, the query stage's)."""

import json
import math

import httpx
import numpy as np

from scaleforge.pipeline.load import Request, closed_loop, infer_request
from serving.binary import HEADER
from serving.responses import SERVER_TIMING, parse_server_timing
from serving_parts.common import BATCH
from serving_parts.cpu import CpuSplit

CLOSE = {"connection": "close"}
"""Sent by every client when several run: uvicorn's workers share one listening socket, and 8 kept-alive
connections often all land on the worker that woke first, idling the other core. One client keeps its
connection."""


def bodies(path: str, x: np.ndarray, clients: int, **parameters) -> list[Request]:
    """Requests of ``BATCH`` rows as V2 JSON to ``path``, for ``clients`` clients."""
    requests = [
        infer_request(path, x[i : i + BATCH], parameters) for i in range(0, len(x) - BATCH + 1, BATCH)
    ]
    return [_closing(r, clients) for r in requests]


def binary_bodies(path: str, x: np.ndarray, clients: int, **parameters) -> list[Request]:
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
        headers = {"content-type": "application/octet-stream", HEADER: str(len(header))}
        requests.append(_closing(Request(path, header + raw, headers), clients))
    return requests


def _closing(request: Request, clients: int) -> Request:
    if clients == 1:
        return request
    return Request(request.path, request.body, request.headers | CLOSE, request.label)


def predicted_classes(response: httpx.Response) -> np.ndarray:
    """The ``class`` output (the first) of a V2 response, JSON or binary."""
    if HEADER.lower() not in response.headers:
        return np.asarray(response.json()["outputs"][0]["data"])
    length = int(response.headers[HEADER])
    first = json.loads(response.content[:length])["outputs"][0]
    return np.frombuffer(response.content[length : length + first["parameters"]["binary_data_size"]], "<i8")


def _read(ticket: int, response: httpx.Response) -> tuple:
    """What a client keeps of an answer: the predicted classes (None if it failed) and the ingress's
    ``Server-Timing`` (where its time went, when our ingress answered)."""
    timing = parse_server_timing(response.headers.get(SERVER_TIMING, ""))
    return (predicted_classes(response) if response.status_code == 200 else None), timing


def drive(
    urls: list[str], requests: list[Request], labels: list[np.ndarray], clients: int, seconds: float
) -> dict:
    """Closed loop (the library's): ``clients`` clients, each sending its next request when the last
    returns, for ``seconds`` after one uncounted request each.

    ``urls``: one base URL, or one per replica (direct ingress gives each replica a port of its own):
    the clients are spread over them in turn, as a load balancer over Serve's target group spreads
    them. A failed connection is not retried. Accuracy counts each distinct request once (inputs
    weigh alike). The CPU the run took per request (:class:`~serving_parts.cpu.CpuSplit`) counts the
    uncounted requests too."""
    with CpuSplit() as cpu:
        load = closed_loop(urls, requests, _read, clients, seconds, warmup=True, attempts=1)
    latencies = [a.latency_s for a in load.answers]
    hops = [
        (1e3 * a.latency_s - timing["ingress"], timing["ingress"] - timing["model"], timing["model"])
        for a in load.answers
        if {"ingress", "model"} <= set(timing := a.value[1])  # our ingress says where its time went
    ]
    correct = {
        a.request: int((a.value[0] == labels[a.request]).sum()) for a in load.answers if a.status == 200
    }
    failures = sum(a.status != 200 for a in load.answers)
    proxy, ingress, model = np.median(hops, axis=0) if hops else (math.nan,) * 3
    return {
        "throughput": (len(latencies) - failures) * BATCH / load.seconds,
        "p50": 1e3 * np.percentile(latencies, 50),
        "p99": 1e3 * np.percentile(latencies, 99),
        "failures": failures,
        "accuracy": sum(correct.values()) / max(len(correct) * BATCH, 1),
        "proxy_ms": proxy,
        "ingress_ms": ingress,
        "model_ms": model,
        **cpu.per_request_ms(len(load.answers) + clients),
    }
