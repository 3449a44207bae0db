"""Text from a language model over OpenAI's completions API (router kind ``generator``): the official
client, streaming and not; the model alone, speculative decoding with a drafter model and with prompt
lookup giving the same greedy text; continuous batching; refusals that name the field; and a client
that leaves mid-stream freeing its slot."""

import asyncio
import time

import httpx
import openai
import pytest
from lm_env import stdlib_bytes, trained_lms
from ray import serve
from serving_env import DASHBOARD_ROWS, dashboard_metrics, missing_metrics, running_serve, small_deployment

from serving.app import build_app

APP = "sf-generator"


@pytest.fixture(scope="module")
def base(ray_cluster, tmp_path_factory) -> str:
    lms = trained_lms(tmp_path_factory)
    target, drafter = lms["target"], lms["drafter"]
    generator = {
        "kind": "generator",
        "model": "target",
        "max_running": 4,
        "max_waiting": 2,
        "max_tokens": 400,
    }
    args = {
        "models": [
            {"name": "target", "artifact": target, "in_ingress": True},
            {"name": "drafter", "artifact": drafter, "in_ingress": True},
        ],
        "routers": [
            generator | {"name": "lm", "drafter": "drafter"},
            generator | {"name": "lm-spec", "drafter": "drafter", "draft_tokens": 4},
            generator | {"name": "lm-lookup", "drafter": "lookup", "draft_tokens": 4},
        ],
        "ingress": small_deployment(max_ongoing_requests=32),
    }
    port = running_serve()
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    yield f"http://127.0.0.1:{port}/{APP}"
    serve.delete(APP)


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    text = stdlib_bytes()[1].decode("utf-8", errors="ignore")
    return [text[i : i + 40] for i in range(0, 4000, 1000)]


def test_the_openai_client_streaming_and_not_and_speculation_changes_nothing(base, prompts):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    assert {m.id for m in client.models.list().data} == {"lm", "lm-spec", "lm-lookup"}
    for prompt in prompts:
        whole = client.completions.create(model="lm", prompt=prompt, max_tokens=100, temperature=0)
        assert whole.choices[0].finish_reason == "length"
        assert whole.usage.completion_tokens == 100 and whole.usage.prompt_tokens == len(prompt.encode())
        chunks = list(
            client.completions.create(model="lm", prompt=prompt, max_tokens=100, temperature=0, stream=True)
        )
        assert len(chunks) > 10  # one event per run of tokens, not one at the end
        assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
        for name in ("lm-spec", "lm-lookup"):
            other = client.completions.create(model=name, prompt=prompt, max_tokens=100, temperature=0)
            assert other.choices[0].text == whole.choices[0].text, name
    described = httpx.get(f"{base}/v1/models/lm-spec", timeout=30).json()
    assert described["accepted_tokens"] > 0 and described["drafted_tokens"] >= described["accepted_tokens"]


def test_sampling_with_a_seed_repeats_and_a_stop_string_ends_the_text(base):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    runs = [
        client.completions.create(
            model="lm-spec", prompt="def ", max_tokens=60, temperature=0.8, top_p=0.9, seed=7
        )
        for _ in range(2)
    ]
    assert runs[0].choices[0].text == runs[1].choices[0].text
    long = (
        client.completions.create(model="lm", prompt="import os\n", max_tokens=200, temperature=0)
        .choices[0]
        .text
    )
    stop = long[20:23]
    cut = client.completions.create(
        model="lm", prompt="import os\n", max_tokens=200, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == long[: long.index(stop)]


@pytest.mark.parametrize(
    "body,status,param",
    [
        ({"model": "lm", "prompt": "x" * 65}, 400, "prompt"),
        ({"model": "lm", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": "lm", "prompt": "x", "max_tokens": 401}, 400, "max_tokens"),
        ({"model": "lm", "prompt": "x", "temperature": -0.1}, 400, "temperature"),
        ({"model": "lm", "prompt": "x", "top_p": 0}, 400, "top_p"),
        ({"model": "lm", "prompt": "x", "top_p": 1.5}, 400, "top_p"),
        ({"model": "nope", "prompt": "x"}, 404, "model"),
        ({"model": "lm", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"model": "lm", "prompt": "x", "n": 2}, 400, "n"),
        ({"model": "lm", "prompt": "x", "draft_tokens": 99}, 400, "draft_tokens"),
        (b"{not json", 400, None),
        (b'{"model": "lm", "prompt": "\xff\xfe"}', 400, None),
    ],
)
def test_bad_input_is_refused_naming_the_field(base, body, status, param):
    sent = {"content": body} if isinstance(body, bytes) else {"json": body}
    answer = httpx.post(f"{base}/v1/completions", timeout=30, **sent)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["message"]
    if param:
        assert param in error["message"]
    # Nothing disturbed: the next request is answered.
    ok = httpx.post(
        f"{base}/v1/completions", json={"model": "lm", "prompt": "x", "max_tokens": 2}, timeout=30
    )
    assert ok.status_code == 200


def test_a_short_request_finishes_before_a_long_one_and_steps_are_batched(base):
    async def run():
        finished = []
        async with httpx.AsyncClient(base_url=base, timeout=120) as client:

            async def one(name, max_tokens):
                body = {"model": "lm", "prompt": "class ", "max_tokens": max_tokens, "temperature": 0}
                assert (await client.post("/v1/completions", json=body)).status_code == 200
                finished.append(name)

            await asyncio.gather(one("long", 300), one("short", 10))
        return finished

    assert asyncio.run(run()) == ["short", "long"]
    batch_sizes = httpx.get(f"{base}/v1/models/lm", timeout=30).json()["batch_sizes"]
    assert max(int(size) for size in batch_sizes) >= 2, batch_sizes


def test_a_client_that_leaves_mid_stream_frees_its_slot(base):
    body = {"model": "lm-lookup", "prompt": "def ", "max_tokens": 400, "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as response:
        events = response.iter_lines()
        assert next(events).startswith("data: ")
        running = httpx.get(f"{base}/v1/models/lm-lookup", timeout=30).json()["running"]
    assert running == 1
    deadline = time.monotonic() + 20
    while (
        httpx.get(f"{base}/v1/models/lm-lookup", timeout=30).json()["running"] and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    assert httpx.get(f"{base}/v1/models/lm-lookup", timeout=30).json()["running"] == 0


def test_the_v2_endpoint_answers_the_next_token(base):
    ids = list(b"import os\nimport sy" + b" " * 45)[:64]
    body = {"inputs": [{"name": "ids", "shape": [1, 64], "datatype": "FP32", "data": ids}]}
    answer = httpx.post(f"{base}/v2/models/lm/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    bad = httpx.post(
        f"{base}/v2/models/lm/infer", json=body | {"inputs": [body["inputs"][0] | {"data": [0.5] * 64}]}
    )
    assert bad.status_code == 400 and "token ids" in bad.json()["error"]


def test_the_dashboard_reads_only_metrics_a_generator_exports(base, metrics_port):
    """Must-show 5 of issue 49: every metric that the Grafana dashboard's request and language-model
    panels query (tokens/s, time to first token, inter-token latency, running and waiting
    sequences) is exported by Ray for this app, after one streamed completion of its own."""
    body = {"model": "lm", "prompt": "def ", "max_tokens": 20, "stream": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200 and list(response.iter_lines())
    names = dashboard_metrics(DASHBOARD_ROWS["test_generator.py"])
    assert len(names) >= 7, names
    assert missing_metrics(metrics_port, names) == set()
