"""The query stage of the main job on text: held-out prompts streamed from every served generator.

Each load is ``clients`` threads, each with its own HTTP connection, streaming greedy completions
(``stream: true``, server-sent events) of the next prompt as soon as its last one ended, until every
prompt was sent once. Tokens/s counts the completion tokens the server reports (``include_usage``);
time to first token is read off the first event that carries text. The engines' counters (drafted and
accepted tokens, rows per decode step) are read from ``GET /v1/models/{name}`` of each ingress replica
before and after, where the replicas' own URLs are known.
"""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import httpx
import numpy as np

from scaleforge.config import ServeConfig, load_config
from scaleforge.config.pipeline_lm import TextQuerySpec
from scaleforge.pipeline.base import PipelineStage, StageContext
from scaleforge.pipeline.records_lm import GeneratorLoad, GeneratorResult, Sample, TextQueryRecord
from scaleforge.routers import GeneratorEntry

TIMEOUT_S = 300.0


class TextQueryStage(PipelineStage):
    """Tokens/s at each load, time to first token, acceptance and batch sizes of every served generator
    (``query.generators``), and sample completions, over HTTP."""

    name = "query"
    record = TextQueryRecord
    reusable = False
    needs_running = ("serve",)

    def run(self, ctx: StageContext) -> TextQueryRecord:
        from scaleforge.generate.prompts import held_out_prompts

        served, spec = ctx.records.serve, ctx.cfg.query
        generators = _served_generators(served.serve_config)
        names = spec.generators or list(generators)
        unknown = [name for name in names if name not in generators]
        if unknown:
            raise ValueError(f"query.generators: {unknown} not served (served: {', '.join(generators)})")
        prompts = [p.decode() for p in held_out_prompts(max(spec.prompts, *spec.clients), spec.prompt_bytes)]
        urls = served.direct_urls or [served.url]
        results, texts = {}, {}
        for name in names:
            results[name], texts[name] = query_generator(
                urls, name, generators[name], prompts, spec, bool(served.direct_urls), ctx
            )
        shown = ctx.records.calibrate.generator if ctx.records.calibrate.generator in texts else names[0]
        return TextQueryRecord(
            url=urls[0],
            direct=bool(served.direct_urls),
            prompt_bytes=spec.prompt_bytes,
            max_tokens=spec.max_tokens,
            generators=results,
            samples=[Sample(prompt=p, completion=t) for p, t in zip(prompts, texts[shown][: spec.samples])],
            pipeline_wall_s=time.perf_counter() - ctx.started,
        )


def _served_generators(serve_config: Optional[str]) -> dict[str, tuple[str, str]]:
    """Generator name -> (the served model it decodes, its artifact), from the serve config the serve
    stage deployed."""
    args = load_config(ServeConfig, serve_config).applications[0].args
    return {g.name: (g.model, args.model(g.model).artifact) for g in args.routers_of(GeneratorEntry)}


def query_generator(
    urls: list[str],
    name: str,
    model: tuple[str, str],
    prompts: list[str],
    spec: TextQuerySpec,
    direct: bool,
    ctx: StageContext,
) -> tuple[GeneratorResult, list[str]]:
    """Every load of ``spec.clients`` on generator ``name`` (which decodes ``model``: its served name and
    artifact), and the
    texts of the first load; the engine counters where ``direct`` (``urls`` are every replica's own)."""
    stream_load(urls, name, prompts[:1], 1, spec.max_tokens)  # warm-up: the replica's first request
    loads, texts = [], []
    for clients in spec.clients:
        before = _counters(urls, name) if direct else None
        load, got = stream_load(urls, name, prompts[: max(spec.prompts, clients)], clients, spec.max_tokens)
        if before is not None:
            load = load.model_copy(update=_engine_figures(before, _counters(urls, name)))
        ctx.log(
            f"[query] {name}: {clients} client(s), {load.tokens_per_s:,.0f} tokens/s, first token p50 "
            f"{load.first_token_p50_ms:.1f} ms"
            + (f", {load.rows_per_step:.1f} rows per decode step" if load.rows_per_step else "")
        )
        loads.append(load)
        texts = texts or got
    return GeneratorResult(model=model[0], artifact=model[1], loads=loads), texts


def _engine_figures(before: dict, after: dict) -> dict:
    """Acceptance, mean and largest rows per decode step between two reads of the counters."""
    drafted, accepted = (after[k] - before[k] for k in ("drafted_tokens", "accepted_tokens"))
    steps = {int(size): n - before["batch_sizes"].get(size, 0) for size, n in after["batch_sizes"].items()}
    steps = {size: n for size, n in steps.items() if n}
    return {
        "acceptance": accepted / drafted if drafted else None,
        "rows_per_step": sum(s * n for s, n in steps.items()) / max(1, sum(steps.values())),
        "largest_step": max(steps, default=0),
    }


def _counters(urls: list[str], name: str) -> dict:
    """The engine counters of ``name`` summed over the replicas at ``urls``."""
    total: dict = {"drafted_tokens": 0, "accepted_tokens": 0, "batch_sizes": {}}
    for url in urls:
        answer = httpx.get(f"{url}/v1/models/{name}", timeout=30)
        answer.raise_for_status()
        stats = answer.json()
        total["drafted_tokens"] += stats["drafted_tokens"]
        total["accepted_tokens"] += stats["accepted_tokens"]
        for size, n in stats["batch_sizes"].items():
            total["batch_sizes"][size] = total["batch_sizes"].get(size, 0) + n
    return total


def stream_load(
    urls: list[str], name: str, prompts: list[str], clients: int, max_tokens: int
) -> tuple[GeneratorLoad, list[str]]:
    """``clients`` streaming clients (spread over ``urls``) completing every prompt once; the texts in
    prompt order."""
    answers: list[Optional[tuple[float, int, str]]] = [None] * len(prompts)
    taken = iter(range(len(prompts)))
    lock = threading.Lock()

    def client(index: int) -> None:
        with httpx.Client(base_url=urls[index % len(urls)], timeout=TIMEOUT_S) as http:
            while True:
                with lock:
                    prompt = next(taken, None)
                if prompt is None:
                    return
                answers[prompt] = _stream_one(http, name, prompts[prompt], max_tokens)

    began = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))  # re-raises a client's error
    seconds = time.perf_counter() - began
    first = np.array([a[0] for a in answers]) * 1e3
    tokens = sum(a[1] for a in answers)
    load = GeneratorLoad(
        clients=clients,
        requests=len(prompts),
        tokens=tokens,
        seconds=seconds,
        tokens_per_s=tokens / seconds,
        first_token_p50_ms=float(np.percentile(first, 50)),
        first_token_p99_ms=float(np.percentile(first, 99)),
    )
    return load, [a[2] for a in answers]


def _stream_one(http: httpx.Client, name: str, prompt: str, max_tokens: int) -> tuple[float, int, str]:
    """(seconds to the first text, completion tokens, text) of one streamed greedy completion."""
    body = {
        "model": name,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent, first, tokens, text = time.perf_counter(), None, None, []
    with http.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{name}: HTTP {response.status_code}: {response.read()[:300].decode()}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            tokens = event["usage"]["completion_tokens"] if event.get("usage") else tokens
            for choice in event["choices"]:
                if choice["text"] and first is None:
                    first = time.perf_counter() - sent
                text.append(choice["text"])
    if tokens is None or first is None:
        raise RuntimeError(f"{name}: the stream ended without text or usage ({''.join(text)!r})")
    return first, tokens, "".join(text)
