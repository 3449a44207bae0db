"""Deploy the calibrated Serve config and send the held-out test set through its HTTP endpoint."""

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np

from scaleforge.data import DataSpec, load_arrays

SERVED = ("teacher", "student", "cascade", "moe")
"""The endpoint's models queried: both ends of the cascade, the cascade itself and the MoE router."""


def serve_and_query(pipeline) -> dict[str, Any]:
    """Start Serve with the pipeline's calibrated config, query every served model, stop Serve."""
    from ray import serve

    from scaleforge.deploy import deploy

    cfg, placement = pipeline.serve_config()
    url = deploy(cfg)
    try:
        x, y = _test_set(pipeline)
        return {"url": url, "inputs": len(y), "placement": placement,
                "models": {name: query_model(url, name, x, y, pipeline.cfg.query) for name in SERVED}}
    finally:
        serve.shutdown()


def test_set(calibrate_record: dict) -> tuple[np.ndarray, np.ndarray]:
    """The held-out split of the data that the cascade was calibrated on."""
    arrays = load_arrays(DataSpec.model_validate(calibrate_record["data"]))
    return arrays.x_test.astype(np.float32), arrays.y_test


def _test_set(pipeline) -> tuple[np.ndarray, np.ndarray]:
    x, y = test_set(pipeline.records["calibrate"])
    limit = pipeline.cfg.query.max_inputs or len(y)
    return x[:limit], y[:limit]


def query_model(url: str, name: str, x: np.ndarray, y: np.ndarray, spec) -> dict[str, Any]:
    """POST the inputs in batches from ``spec.concurrency`` clients; accuracy, latency and routing shares."""
    batches = [(start, x[start:start + spec.batch_size]) for start in range(0, len(x), spec.batch_size)]
    parameters = {"trace": True} if name in ("cascade", "moe") else {}

    def send(item):
        start, rows = item
        body = {"inputs": [{"name": "input", "shape": list(rows.shape), "datatype": "FP32",
                            "data": rows.ravel().tolist()}], "parameters": parameters}
        began = time.perf_counter()
        response = client.post(f"/v2/models/{name}/infer", json=body)
        elapsed = time.perf_counter() - began
        response.raise_for_status()
        return start, elapsed, {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in response.json()["outputs"]}

    with httpx.Client(base_url=url, timeout=120) as client, ThreadPoolExecutor(spec.concurrency) as pool:
        began = time.perf_counter()
        answers = sorted(pool.map(send, batches), key=lambda a: a[0])
        wall = time.perf_counter() - began
    outputs = {key: np.concatenate([a[2][key] for a in answers]) for key in answers[0][2]}
    latencies = np.array([a[1] for a in answers]) * 1e3
    result = {"accuracy": float((outputs["class"].ravel() == y).mean()), "p50_ms": float(np.percentile(latencies, 50)),
              "p99_ms": float(np.percentile(latencies, 99)), "inputs_per_s": len(y) / wall}
    if "stage" in outputs:
        stages = outputs["stage"].ravel().astype(int)
        result["answered_per_stage"] = [float((stages == s).mean()) for s in range(int(stages.max()) + 1)]
    if "experts" in outputs:
        first = outputs["experts"][:, 0].astype(int)
        result["first_expert_share"] = [float((first == e).mean()) for e in range(int(first.max()) + 1)]
        result["fallbacks"] = int(np.asarray(outputs.get("fallback", np.zeros(1))).sum())
    return result
