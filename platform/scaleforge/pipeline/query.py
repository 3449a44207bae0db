"""The query stage: the held-out test set sent through every served model's HTTP endpoint."""

import time
from typing import Optional

import httpx
import numpy as np

from scaleforge.calibrate.split import held_out_split
from scaleforge.config.pipeline import QuerySpec
from scaleforge.pipeline.base import PipelineStage, StageContext
from scaleforge.pipeline.load import Load, closed_loop, infer_request
from scaleforge.pipeline.records import CalibrateRecord, QueryRecord, ServedModelResult


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
        models = query_passes(urls, ctx.cfg.serve.endpoints, x, y, ctx.cfg.query)
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


def query_passes(
    urls: list[str], names: list[str], x: np.ndarray, y: np.ndarray, spec: QuerySpec
) -> dict[str, ServedModelResult]:
    """Every model in ``names`` queried ``spec.passes`` times, in reverse order in every other pass;
    each model's result is its median pass by inputs/s (the lower middle one of an even count: a pass
    that ran), with every pass's inputs/s beside it."""
    passes: dict[str, list[ServedModelResult]] = {name: [] for name in names}
    for index in range(spec.passes):
        for name in names if index % 2 == 0 else names[::-1]:
            label = f", pass {index + 1}/{spec.passes}" if spec.passes > 1 else ""
            passes[name].append(query_model(urls, name, x, y, spec, label))
    results = {}
    for name, runs in passes.items():
        median = sorted(runs, key=lambda run: run.inputs_per_s)[(len(runs) - 1) // 2]
        results[name] = median.model_copy(
            update={"inputs_per_s_per_pass": [run.inputs_per_s for run in runs] if len(runs) > 1 else None}
        )
    return results


def query_model(
    urls: list[str], name: str, x: np.ndarray, y: np.ndarray, spec: QuerySpec, label: str = ""
) -> ServedModelResult:
    """POST the inputs in batches from ``spec.concurrency`` clients, each sending its next batch as soon
    as its last one is answered, for one pass over the inputs or ``spec.seconds`` if longer; accuracy
    (over the first pass), latency, throughput and routing shares. ``urls``: the endpoint's base URLs
    (the proxy, or each ingress replica's own), the clients spread over them; ``label``: the end of the
    progress bar's label."""
    parameters = {"trace": True}  # a router adds its trace outputs; a plain model has none
    requests = [
        infer_request(
            f"/v2/models/{name}/infer",
            x[start : start + spec.batch_size],
            parameters,
            f"[query] {name}: rows {start}+",
        )
        for start in range(0, len(x), spec.batch_size)
    ]

    def read(ticket: int, response: httpx.Response) -> Optional[dict[str, np.ndarray]]:
        response.raise_for_status()
        if ticket >= len(requests):  # scored over the first pass only
            return None
        return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in response.json()["outputs"]}

    load = closed_loop(
        urls,
        requests,
        read,
        spec.concurrency,
        spec.seconds,
        at_least=len(requests),
        progress=f"[query] {name}: requests{label}",
    )
    rows = [min(spec.batch_size, len(x) - start) for start in range(0, len(x), spec.batch_size)]
    return served_result(load, rows, y)


def served_result(load: Load, rows: list[int], y: np.ndarray) -> ServedModelResult:
    """Accuracy (over the first pass), latency, throughput and routing shares of a query's load;
    ``rows``: the inputs of each request."""
    first_pass = sorted((a for a in load.answers if a.value is not None), key=lambda a: a.request)
    outputs = {key: concat_rows([a.value[key] for a in first_pass]) for key in first_pass[0].value}
    latencies = np.array([a.latency_s for a in load.answers]) * 1e3
    result = ServedModelResult(
        accuracy=float((outputs["class"].ravel() == y).mean()),
        p50_ms=float(np.percentile(latencies, 50)),
        p99_ms=float(np.percentile(latencies, 99)),
        inputs_per_s=sum(rows[a.request] for a in load.answers) / load.seconds,
        requests=len(load.answers),
        seconds=load.seconds,
    )
    if "stage" in outputs:
        stages = outputs["stage"].ravel().astype(int)
        result.answered_per_stage = [float((stages == s).mean()) for s in range(int(stages.max()) + 1)]
    if "experts" in outputs:
        first = outputs["experts"][:, 0].astype(int)
        result.first_expert_share = [float((first == e).mean()) for e in range(int(first.max()) + 1)]
        result.fallbacks = int(np.asarray(outputs.get("fallback", np.zeros(1))).sum())
    return result


def concat_rows(parts: list[np.ndarray]) -> np.ndarray:
    """The batches' answers as one array, row after row. Where a traced output is narrower in one
    batch than in another (the MoE router answers with the experts it could use: one column fewer
    while an expert is down), the narrower rows are padded: -1 for ids, False for flags."""
    width = max((p.shape[1] for p in parts if p.ndim > 1), default=None)
    if width is None or all(p.shape[1] == width for p in parts):
        return np.concatenate(parts)
    fill = False if parts[0].dtype == bool else -1
    return np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=fill) for p in parts])
