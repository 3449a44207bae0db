"""The plain peer of bench/generate.py: the exported model behind FastAPI under uvicorn, generating with
Hugging Face ``transformers`` ``generate``, no Ray.

    HF_MODEL=<exported folder> [HF_ASSISTANT=<exported drafter folder>] \\
        .venv/bin/python -m uvicorn hf_generate:app --app-dir bench/peers --workers 2 \\
        --host 127.0.0.1 --port 8002

What a user would stand up instead of a serving system: each worker loads the folder that
``python -m scaleforge.artifacts.hf`` wrote (``GPT2LMHeadModel.from_pretrained``, eval, one torch
thread) and answers ``POST /v1/completions`` (prompt, max_tokens, temperature 0 = greedy, stream) by
``model.generate`` with its KV cache (``use_cache=True``), the prompt as byte ids. ``stream: true``
sends one server-sent event per token through ``TextIteratorStreamer``, as transformers' docs show for
serving; ``assisted: true`` (ours: ``draft_tokens``) runs transformers' assisted generation with the
exported drafter as ``assistant_model``. Each request runs ``generate`` in FastAPI's thread pool, so a
worker interleaves the requests it holds; ``generate`` has no batching across requests.
"""

import os
import threading
import time

import orjson
import torch
from fastapi import Body, FastAPI
from fastapi.responses import Response, StreamingResponse
from transformers import GPT2LMHeadModel, TextIteratorStreamer

torch.set_num_threads(1)
MODEL = GPT2LMHeadModel.from_pretrained(os.environ["HF_MODEL"]).eval()
ASSISTANT = (
    GPT2LMHeadModel.from_pretrained(os.environ["HF_ASSISTANT"]).eval()
    if os.environ.get("HF_ASSISTANT")
    else None
)
app = FastAPI()


class ByteDecoder:
    """What ``TextIteratorStreamer`` needs of a tokenizer: our ids are bytes."""

    def decode(self, ids, **_) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def _generate(body: dict, streamer=None) -> torch.Tensor:
    ids = torch.tensor([list(body["prompt"].encode())])
    extra = {"assistant_model": ASSISTANT} if body.get("assisted") and ASSISTANT is not None else {}
    with torch.inference_mode():
        return MODEL.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=body.get("max_tokens", 16),
            min_new_tokens=body.get("max_tokens", 16),
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
            streamer=streamer,
            **extra,
        )[0, ids.shape[1] :]


@app.get("/health")
def health() -> dict:
    return {"ready": True, "pid": os.getpid()}


@app.post("/v1/completions")
def completions(body: dict = Body()) -> Response:  # noqa: B008 - FastAPI's body; a plain def runs in FastAPI's thread pool
    if body.get("stream"):
        streamer = TextIteratorStreamer(ByteDecoder(), skip_prompt=True)
        threading.Thread(target=_generate, args=(body, streamer), daemon=True).start()

        def events():
            for text in streamer:
                if text:
                    yield b"data: " + orjson.dumps({"choices": [{"text": text}]}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")
    return Response(orjson.dumps(_answer(body)), media_type="application/json")


def _answer(body: dict) -> dict:
    began = time.perf_counter()
    tokens = _generate(body).tolist()
    return {
        "choices": [{"text": bytes(tokens).decode("utf-8", errors="replace"), "finish_reason": "length"}],
        "usage": {"completion_tokens": len(tokens)},
        "seconds": time.perf_counter() - began,
    }
