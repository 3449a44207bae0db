"""The load each side gets (the library's closed-loop clients, as every serving bench), and the cache
comparison measured in-process."""

import time
from dataclasses import dataclass

import httpx
import numpy as np
import orjson
import torch

from scaleforge.pipeline.load import JSON, Request, closed_loop


@dataclass(frozen=True)
class Figures:
    """One side's figures in one round."""

    tokens_per_s: dict[str, float]
    """Generated tokens/s by load name."""
    ttft_ms: float
    """p50 of a one-token completion at 1 client: time to first token, HTTP included."""
    texts: dict[str, list[str]]
    """The greedy text of each prompt, by load name (the 1-client loads)."""


def completions(prompts: list[bytes], max_tokens: int, **extra) -> list[Request]:
    """One greedy ``/v1/completions`` request per prompt."""
    return [
        Request(
            "/v1/completions",
            orjson.dumps(
                {"model": "lm", "prompt": p.decode(), "max_tokens": max_tokens, "temperature": 0} | extra
            ),
            JSON,
            f"prompt {i}",
        )
        for i, p in enumerate(prompts)
    ]


def generated(urls: list[str], requests: list[Request], clients: int, rounds: int) -> tuple[float, list[str]]:
    """Tokens/s of ``clients`` closed-loop clients sending every request ``rounds`` times over (after one
    warm-up request each), and the text each request got the first time."""

    def read(ticket: int, response: httpx.Response) -> tuple[int, str]:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        body = response.json()
        return body["usage"]["completion_tokens"], body["choices"][0]["text"]

    load = closed_loop(urls, requests, read, clients, at_least=rounds * len(requests), warmup=True)
    tokens = sum(a.value[0] for a in load.answers)
    texts = {a.request: a.value[1] for a in sorted(load.answers, key=lambda a: a.ticket)[::-1]}
    return tokens / load.seconds, [texts[i] for i in range(len(requests))]


def first_token_ms(urls: list[str], prompts: list[bytes], repeats: int = 5) -> float:
    """p50 latency of one-token completions at 1 client."""
    load = closed_loop(
        urls[:1],
        completions(prompts, 1),
        lambda t, r: r.status_code,
        1,
        at_least=repeats * len(prompts),
        warmup=True,
    )
    return 1000 * float(np.median([a.latency_s for a in load.answers]))


@torch.inference_mode()
def cache_against_recompute(model: torch.nn.Module, prompt: bytes, new_tokens: int) -> dict[str, float]:
    """Greedy tokens/s of one sequence on one thread: the engine's cached step against the whole window
    run again for every token (what generation costs without a KV cache)."""
    import asyncio

    from scaleforge.generate.engine import Engine
    from scaleforge.generate.sampling import Sampling

    engine = Engine(model, None, max_running=1, max_waiting=1)

    async def cached():
        sequence = engine.submit(list(prompt), new_tokens, Sampling(0.0))
        return [t async for run in engine.stream(sequence) for t in run]

    began = time.perf_counter()
    with_cache = asyncio.run(cached())
    cached_s = time.perf_counter() - began
    tokens, began = list(prompt), time.perf_counter()
    for _ in range(new_tokens):
        tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
    recompute_s = time.perf_counter() - began
    if tokens[len(prompt) :] != with_cache:
        raise RuntimeError("the cached and the recomputed greedy tokens differ")
    return {"cached": new_tokens / cached_s, "recomputed": new_tokens / recompute_s}
