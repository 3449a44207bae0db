"""The plain peer of bench/serving.py: the cascade, its student and its teacher behind FastAPI under
uvicorn, no Ray.

    PLAIN_STUDENT=<artifact folder> PLAIN_TEACHER=<artifact folder> PLAIN_THRESHOLD=0.77 \\
        [PLAIN_STUDENT_MERGED=8 PLAIN_TEACHER_MERGED=8] \\
        .venv/bin/python -m uvicorn plain_cascade:app --app-dir bench/peers --workers 2 \\
        --host 127.0.0.1 --port 8001

What a careful engineer writes for one machine, doing the served cascade's work: each worker process
loads both artifacts with the loader Serve uses (``load_servable``) and runs them on one torch thread
each; ``POST /v2/models/{student,teacher,cascade}/infer`` take V2 JSON (or the binary tensor
extension) and answer as the ingress does, read and written with orjson straight to and from numpy.
Concurrent calls of one model are merged into one forward pass, as the served models merge them: no
added wait, at most ``max_batch_size`` requests. The cascade hands inputs on with the library's own
policy (``scaleforge.routing.escalate``, the same measure and calibrated threshold), and only the
handed-on rows run the teacher; a request's ``min_confidence`` overrides the threshold.

Profiled with cProfile at 8 clients: past the forward passes, the time goes to uvicorn's and
FastAPI's request handling, orjson and numpy's conversion of the JSON list (one float32 array, no
float64 copy); nothing is validated twice and no per-request object is built that the answer does not
need.
"""

import asyncio
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import orjson
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "platform"), str(REPO)]

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import Response  # noqa: E402

from scaleforge.artifacts.servable import load_servable  # noqa: E402
from scaleforge.config.serve import LimitsSpec, ModelEntry  # noqa: E402
from scaleforge.routing import escalate  # noqa: E402

MAX_ROWS = LimitsSpec.model_fields["max_batch_size"].default  # the ingress's limit per request
MAX_MERGED = ModelEntry.model_fields["max_batch_size"].default  # the served models' default
HEADER = "inference-header-content-length"  # the binary tensor extension's header
MEASURE = "max_prob"


class MergedForward:
    """One model's probabilities, concurrent calls merged into one forward pass on the event loop.

    A call queues its rows; the pass runs once the loop has run every handler that is ready, so the
    requests that arrived meanwhile share it (``@serve.batch`` with no wait does the same)."""

    def __init__(self, artifact: str, max_merged: int):
        self.model, self.max_merged = load_servable(artifact), max_merged
        self.input_dim = self.model.input_dim
        self.waiting: list[tuple[np.ndarray, asyncio.Future]] = []

    async def __call__(self, x: np.ndarray) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((x, future))
        if len(self.waiting) == 1:
            asyncio.get_running_loop().call_soon(self._run)
        return await future

    def _run(self) -> None:
        batch, self.waiting = self.waiting[: self.max_merged], self.waiting[self.max_merged :]
        if self.waiting:
            asyncio.get_running_loop().call_soon(self._run)
        rows = batch[0][0] if len(batch) == 1 else np.concatenate([x for x, _ in batch])
        with torch.inference_mode():
            probs = self.model.module(torch.from_numpy(rows)).softmax(dim=1).numpy()
        start = 0
        for x, future in batch:
            future.set_result(probs[start : start + len(x)])
            start += len(x)


class BadRequest(Exception):
    """A request this server refuses with 400."""


# A binary request's features are a read-only view of its body (no copy): torch warns that a tensor over
# them must not be written, and the forward pass never writes its input.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
torch.set_num_threads(1)
student = MergedForward(os.environ["PLAIN_STUDENT"], int(os.environ.get("PLAIN_STUDENT_MERGED", MAX_MERGED)))
teacher = MergedForward(os.environ["PLAIN_TEACHER"], int(os.environ.get("PLAIN_TEACHER_MERGED", MAX_MERGED)))
threshold = float(os.environ["PLAIN_THRESHOLD"])
app = FastAPI()


@app.get("/v2/health/ready")
async def ready() -> dict:
    return {"ready": True, "pid": os.getpid()}  # the bench waits until it has seen every worker


@app.post("/v2/models/{name}/infer")
async def infer(name: str, request: Request) -> Response:
    body = await request.body()
    try:
        x, header = _features(body, request.headers.get(HEADER))
        parameters = header.get("parameters") or {}
        if name == "cascade":
            outputs, summary = await _cascade(x, float(parameters.get("min_confidence", threshold)))
        elif name in ("student", "teacher"):
            probs = await (student if name == "student" else teacher)(x)
            outputs, summary = {"class": probs.argmax(axis=1), "probabilities": probs}, None
        else:
            return Response(b'{"error":"unknown model"}', 404, media_type="application/json")
    except (BadRequest, KeyError, IndexError, TypeError, ValueError, orjson.JSONDecodeError) as err:
        return Response(
            orjson.dumps({"error": f"bad infer request: {err}"}), 400, media_type="application/json"
        )
    return _answer(name, header.get("id"), outputs, summary, parameters.get("binary_data_output") is True)


def _features(body: bytes, header_length: str | None) -> tuple[np.ndarray, dict]:
    """The request's [rows, input_dim] float32 features and its JSON header."""
    if header_length is None:
        header = orjson.loads(body)
        tensor = header["inputs"][0]
        x = np.array(tensor["data"], dtype=np.float32)
    else:
        length = int(header_length)
        header = orjson.loads(body[:length])
        tensor = header["inputs"][0]
        x = np.frombuffer(body, "<f4", offset=length)
    rows, dim = tensor["shape"]
    if tensor["datatype"] != "FP32" or dim != student.input_dim or not 0 < rows <= MAX_ROWS:
        raise BadRequest(f"expected FP32 [1..{MAX_ROWS}, {student.input_dim}], got {tensor['shape']}")
    x = x.reshape(rows, dim)
    if not np.isfinite(x).all():
        raise BadRequest("NaN or infinite values")
    return x, header


async def _cascade(x: np.ndarray, threshold: float) -> tuple[dict, dict]:
    probs = await student(x)
    handed_on = escalate(torch.from_numpy(probs), threshold, MEASURE).numpy()
    if handed_on.any():  # probs is this request's own rows of the merged pass: written in place
        probs[handed_on] = await teacher(x[handed_on])
    escalated = int(handed_on.sum())
    summary = {"answered_at_stage_0": len(x) - escalated, "escalated": escalated}
    return {"class": probs.argmax(axis=1), "probabilities": probs}, summary


def _answer(name: str, request_id, outputs: dict, summary: dict | None, binary: bool) -> Response:
    tensors = [
        {"name": key, "shape": list(values.shape), "datatype": "INT64" if key == "class" else "FP32"}
        for key, values in outputs.items()
    ]
    response = {"model_name": name, "model_version": "1", "outputs": tensors}
    if request_id is not None:
        response["id"] = request_id
    if summary:
        response["parameters"] = summary
    if not binary:
        for tensor, values in zip(tensors, outputs.values()):
            tensor["data"] = values.ravel()
        return Response(
            orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
        )
    chunks = [np.ascontiguousarray(values).tobytes() for values in outputs.values()]
    for tensor, chunk in zip(tensors, chunks):
        tensor["parameters"] = {"binary_data_size": len(chunk)}
    header = orjson.dumps(response)
    return Response(
        header + b"".join(chunks), media_type="application/octet-stream", headers={HEADER: str(len(header))}
    )
