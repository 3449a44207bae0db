"""The query stage: the held-out test set sent through every served model's HTTP endpoint."""

import itertools
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import httpx
import numpy as np

from scaleforge.calibrate.split import held_out_split
from scaleforge.config.pipeline import QuerySpec
from scaleforge.pipeline.base import PipelineStage, StageContext
from scaleforge.pipeline.records import CalibrateRecord, QueryRecord, ServedModelResult
from scaleforge.progress import bar

RETRIED = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
"""Transport failures after which an inference request is sent again. Inference is idempotent, and a
connection can be cut with no fault of the model's: Serve drains and stops the proxy of a node that
holds no replica, and where proxies share a port (nodes on one machine, ``SO_REUSEPORT``) the
connections queued at the stopped one are reset ('Connection reset by peer')."""
ATTEMPTS = 4


class QueryStage(PipelineStage):
    """Accuracy, latency and routing shares of every served model (``serve.endpoints``), over HTTP."""

    name = "query"
    record = QueryRecord
    reusable = False
    needs_running = ("serve",)

    def run(self, ctx: StageContext) -> QueryRecord:
        served = ctx.records.serve
        x, y = test_set(ctx.records.calibrate)
        limit = ctx.cfg.query.max_inputs or len(y)
        x, y = x[:limit], y[:limit]
        urls = served.direct_urls or [served.url]
        models = {name: query_model(urls, name, x, y, ctx.cfg.query) for name in ctx.cfg.serve.endpoints}
        return QueryRecord(
            url=urls[0],
            inputs=len(y),
            placement=served.placement,
            models=models,
            direct=bool(served.direct_urls),
            pipeline_wall_s=time.perf_counter() - ctx.started,
        )


def test_set(calibrated: CalibrateRecord) -> tuple[np.ndarray, np.ndarray]:
    """The held-out inputs that the cascade's calibration never saw (every served model is scored
    on the same ones, so their accuracies compare)."""
    return held_out_split(calibrated.data, calibrated.calibration_fraction, calibrated.split_seed).judged


def query_model(
    urls: list[str], name: str, x: np.ndarray, y: np.ndarray, spec: QuerySpec
) -> ServedModelResult:
    """POST the inputs in batches from ``spec.concurrency`` clients, each sending its next batch as soon
    as its last one is answered, for one pass over the inputs or ``spec.seconds`` if longer; accuracy
    (over the first pass), latency, throughput and routing shares. ``urls``: the endpoint's base URLs
    (the proxy, or each ingress replica's own), the clients spread over them."""
    batches = [(start, x[start : start + spec.batch_size]) for start in range(0, len(x), spec.batch_size)]
    parameters = {"trace": True} if name in ("cascade", "moe") else {}
    tickets, lock, finished = itertools.count(), threading.Lock(), queue.Queue()

    def send(client: httpx.Client, start: int, rows: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
        body = {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(rows.shape),
                    "datatype": "FP32",
                    "data": rows.ravel().tolist(),
                }
            ],
            "parameters": parameters,
        }
        began = time.perf_counter()
        response = post_idempotent(client, f"/v2/models/{name}/infer", body, f"[query] {name}: rows {start}+")
        elapsed = time.perf_counter() - began  # the latency a client sees, retries included
        response.raise_for_status()
        return elapsed, {
            o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in response.json()["outputs"]
        }

    def closed_loop_client(url: str) -> None:
        try:
            with httpx.Client(base_url=url, timeout=120) as client:
                while True:
                    with lock:  # tickets are sent in order: the requests sent are tickets 0 to n - 1
                        ticket = next(tickets)
                        if ticket >= len(batches) and time.perf_counter() >= deadline:
                            return
                    start, rows = batches[ticket % len(batches)]
                    elapsed, outputs = send(client, start, rows)
                    finished.put((start, len(rows), elapsed, outputs if ticket < len(batches) else None))
        finally:
            finished.put(None)

    def answered() -> Iterator[tuple]:
        ended = 0
        while ended < spec.concurrency:
            item = finished.get()
            if item is None:
                ended += 1
            else:
                yield item

    with ThreadPoolExecutor(spec.concurrency) as pool:
        began = time.perf_counter()
        deadline = began + spec.seconds
        clients = [pool.submit(closed_loop_client, urls[i % len(urls)]) for i in range(spec.concurrency)]
        answers = list(
            bar(answered(), len(batches) if not spec.seconds else None, f"[query] {name}: requests")
        )
        wall = time.perf_counter() - began
        for ended in clients:
            ended.result()  # a client's error, raised here
    first_pass = sorted((a for a in answers if a[3] is not None), key=lambda a: a[0])
    outputs = {key: concat_rows([a[3][key] for a in first_pass]) for key in first_pass[0][3]}
    latencies = np.array([a[2] for a in answers]) * 1e3
    result = ServedModelResult(
        accuracy=float((outputs["class"].ravel() == y).mean()),
        p50_ms=float(np.percentile(latencies, 50)),
        p99_ms=float(np.percentile(latencies, 99)),
        inputs_per_s=sum(a[1] for a in answers) / wall,
        requests=len(answers),
        seconds=wall,
    )
    if "stage" in outputs:
        stages = outputs["stage"].ravel().astype(int)
        result.answered_per_stage = [float((stages == s).mean()) for s in range(int(stages.max()) + 1)]
    if "experts" in outputs:
        first = outputs["experts"][:, 0].astype(int)
        result.first_expert_share = [float((first == e).mean()) for e in range(int(first.max()) + 1)]
        result.fallbacks = int(np.asarray(outputs.get("fallback", np.zeros(1))).sum())
    return result


def post_idempotent(client: httpx.Client, path: str, body: dict, what: str) -> httpx.Response:
    """POST ``body``, sent again (after 0.25, 0.5, 1 s) where the connection failed before an answer came."""
    for attempt in range(ATTEMPTS):
        try:
            return client.post(path, json=body)
        except RETRIED as error:
            if attempt == ATTEMPTS - 1:
                raise
            wait = 0.25 * 2**attempt
            print(f"{what}: {type(error).__name__} ({error}), sent again in {wait:g} s", flush=True)
            time.sleep(wait)
    raise AssertionError("unreachable")


def concat_rows(parts: list[np.ndarray]) -> np.ndarray:
    """The batches' answers as one array, row after row. Where a traced output is narrower in one
    batch than in another (the MoE router answers with the experts it could use: one column fewer
    while an expert is down), the narrower rows are padded: -1 for ids, False for flags."""
    width = max((p.shape[1] for p in parts if p.ndim > 1), default=None)
    if width is None or all(p.shape[1] == width for p in parts):
        return np.concatenate(parts)
    fill = False if parts[0].dtype == bool else -1
    return np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=fill) for p in parts])
