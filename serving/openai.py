"""OpenAI's completions API over the generator routers: ``POST /v1/completions``, ``GET /v1/models``.

What the official ``openai`` client sends and reads: a JSON body (model, prompt, max_tokens,
temperature, top_p, seed, stop, stream, n = 1), a ``text_completion`` object back, or with
``stream: true`` server-sent events, one per run of new tokens, then ``data: [DONE]``. Errors are
OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with the field named in
``param``. One extension: ``draft_tokens`` (the client's ``extra_body``) picks the speculative draft
length for the request, 0 for the model alone.
"""

import codecs
import time
import uuid
from contextlib import aclosing
from typing import Any, AsyncIterator, Literal, Optional, Protocol, Union, runtime_checkable

import orjson
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scaleforge.generate.engine import Engine, EngineFailed, EngineFull
from scaleforge.generate.sampling import Sampling
from scaleforge.serving_contract import ProtocolError


@runtime_checkable
class CompletesText(Protocol):
    """A served name that completes text (the ``generator`` router kind): its engine, tokenizer and entry
    (its limits). The ingress serves OpenAI's routes for every name that has these."""

    engine: Engine
    tokenizer: Any
    entry: Any


class OpenAIError(Exception):
    """A refusal in OpenAI's error shape."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        headers = {"Retry-After": "1"} if self.status == 503 else None
        return JSONResponse(body, status_code=self.status, headers=headers)


def as_openai_error(err: Union[OpenAIError, ProtocolError]) -> OpenAIError:
    """A refusal of the ingress's own (401, 413) in OpenAI's shape."""
    return err if isinstance(err, OpenAIError) else OpenAIError(err.status, err.message)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class CompletionRequest(BaseModel):
    """The body of ``POST /v1/completions`` (fields this server does not offer are refused by name)."""

    model_config = ConfigDict(extra="forbid")
    model: str
    prompt: Union[str, list[str]]
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: Optional[int] = None
    stop: Union[None, str, list[str]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: Literal[1] = 1
    echo: Literal[False] = False
    logprobs: None = None
    user: Optional[str] = None
    draft_tokens: Optional[int] = Field(default=None, ge=0)

    def text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) != 1:
            raise OpenAIError(
                400, f"prompt: give one prompt (a list of {len(self.prompt)} was sent)", "prompt"
            )
        return self.prompt[0]

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


def parse_completion(body: bytes) -> CompletionRequest:
    """The checked request; :class:`OpenAIError` (400) naming the field otherwise."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise OpenAIError(400, f"the body is not UTF-8 (byte {err.start})") from None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise OpenAIError(400, f"the body is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise OpenAIError(400, "the body must be a JSON object")
    try:
        return CompletionRequest.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise OpenAIError(400, f"{field}: {first['msg']}", field) from None


def describe(name: str, engine: Engine) -> dict:
    """``GET /v1/models/{name}``: the model, and what this replica's engine is doing."""
    stats = engine.stats
    return list_models([name])["data"][0] | {
        "running": len(engine.running),
        "waiting": len(engine.waiting),
        "generated_tokens": stats.tokens,
        "drafted_tokens": stats.drafted,
        "accepted_tokens": stats.accepted,
        "batch_sizes": {str(k): v for k, v in sorted(stats.batch_sizes.items())},
    }


def list_models(names: list[str]) -> dict:
    created = int(time.time())
    return {
        "object": "list",
        "data": [{"id": n, "object": "model", "created": created, "owned_by": "scaleforge"} for n in names],
    }


class Text:
    """New tokens to text: whole UTF-8 characters only, cut at the first stop string."""

    def __init__(self, tokenizer: Any, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, stops
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text, self.sent, self.stopped = "", 0, False
        self.hold = max((len(s) for s in stops), default=1) - 1

    def add(self, tokens: list[int]) -> None:
        start = max(0, len(self.text) - self.hold)
        self.text += self.decoder.decode(self.tokenizer.to_bytes(tokens))
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self.text, self.stopped = self.text[: min(hits)], True

    def take(self, final: bool) -> str:
        """Text not yet sent; while the sequence runs, the tail that could begin a stop string waits."""
        end = len(self.text) if final or self.stopped else max(self.sent, len(self.text) - self.hold)
        piece, self.sent = self.text[self.sent : end], end
        return piece


class Completion:
    """One request through a generator: submits it, then renders its tokens as JSON or as events."""

    def __init__(self, name: str, generator: Any, request: CompletionRequest, metrics: Any):
        entry = generator.entry
        self.name, self.generator, self.request, self.metrics = name, generator, request, metrics
        stops = request.stops()
        if len(stops) > entry.max_stop or not all(stops):
            raise OpenAIError(400, f"stop: at most {entry.max_stop} non-empty strings", "stop")
        self.max_tokens = request.max_tokens or entry.default_max_tokens
        if self.max_tokens > entry.max_tokens:
            raise OpenAIError(400, f"max_tokens: at most {entry.max_tokens} for '{name}'", "max_tokens")
        draft = entry.draft_tokens if request.draft_tokens is None else request.draft_tokens
        if draft > entry.max_draft_tokens or (draft and entry.drafter is None):
            raise OpenAIError(
                400,
                f"draft_tokens: '{name}' drafts 0 to {entry.max_draft_tokens if entry.drafter else 0}",
                "draft_tokens",
            )
        prompt = generator.tokenizer.encode(request.text()).tolist()
        self.text, self.prompt_tokens = Text(generator.tokenizer, stops), len(prompt)
        self.id, self.created, self.began = f"cmpl-{uuid.uuid4().hex}", int(time.time()), time.perf_counter()
        sampling = Sampling(request.temperature, request.top_p, request.seed)
        try:
            self.sequence = generator.engine.submit(prompt, self.max_tokens, sampling, draft)
        except EngineFull as err:
            raise OpenAIError(
                503, f"'{name}' is at capacity ({err}); retry later", code="overloaded"
            ) from None
        except ValueError as err:
            raise OpenAIError(400, f"prompt: {err}", "prompt") from None
        self._gauges()

    async def response(self) -> Response:
        if self.request.stream:
            return StreamingResponse(self._events(), media_type="text/event-stream")
        return await self._whole()

    async def _runs(self) -> AsyncIterator[str]:
        """Text as it is generated; the sequence leaves the engine when this closes, early or not."""
        engine, last = self.generator.engine, None
        try:
            async with aclosing(engine.stream(self.sequence)) as runs:
                async for tokens in runs:
                    now = time.perf_counter()
                    self._observe(tokens, now, last)
                    last = now
                    self.text.add(tokens)
                    if self.text.stopped:
                        self.sequence.finish_reason = "stop"
                        break
                    yield self.text.take(final=False)
            yield self.text.take(final=True)
        finally:
            self._gauges()

    async def _whole(self) -> JSONResponse:
        try:
            async with aclosing(self._runs()) as runs:
                async for _ in runs:
                    pass
        except EngineFailed as err:
            raise OpenAIError(500, f"'{self.name}': {err}", code="server_error") from None
        return JSONResponse(self._body(self.text.text, self.sequence.finish_reason, usage=True))

    async def _events(self) -> AsyncIterator[bytes]:
        async with aclosing(self._runs()) as runs:
            async for piece in runs:
                if piece:
                    yield _event(self._body(piece, None))
        yield _event(self._body("", self.sequence.finish_reason))
        if self.request.stream_options and self.request.stream_options.include_usage:
            yield _event(self._body("", None, usage=True) | {"choices": []})
        yield b"data: [DONE]\n\n"

    def _body(self, text: str, finish_reason: Optional[str], usage: bool = False) -> dict:
        body = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.name,
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}],
        }
        if usage:
            done = self.sequence.generated
            body["usage"] = {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": done,
                "total_tokens": self.prompt_tokens + done,
            }
        return body

    def _observe(self, tokens: list[int], now: float, last: Optional[float]) -> None:
        tags = {"model": self.name}
        self.metrics.add(self.metrics.generated_tokens, len(tokens), **tags)
        if last is None:
            self.metrics.time_to_first_token.observe(1000 * (now - self.began), tags=tags)
        elif tokens:
            self.metrics.inter_token_latency.observe(1000 * (now - last) / len(tokens), tags=tags)

    def _gauges(self) -> None:
        engine, tags = self.generator.engine, {"model": self.name}
        self.metrics.running_sequences.set(len(engine.running), tags=tags)
        self.metrics.waiting_sequences.set(len(engine.waiting), tags=tags)


def _event(body: dict) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"
