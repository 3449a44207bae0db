"""The plain-server peer of bench/serving.py: one model behind FastAPI under uvicorn, no Ray.

    PLAIN_ARTIFACT=<artifact folder> [PLAIN_MODEL=<name>] \\
        .venv/bin/python -m uvicorn plain_server:app --app-dir bench/peers --workers 2 \\
        --host 127.0.0.1 --port 8001

What a user writes first for one machine: each worker process loads the artifact with the same loader
as Serve (``load_servable``) and runs it on one torch thread, parses the same V2 JSON request
(``parse_infer_request``: JSON or binary tensors) and answers as the ingress does (``render``). One request
is one forward pass on the event loop (no batching across requests: each request is already a batch).
"""

import os
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "platform"), str(REPO)]

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402

from scaleforge.artifacts.servable import load_servable  # noqa: E402
from scaleforge.serving_contract import ProtocolError  # noqa: E402
from serving.binary import HEADER  # noqa: E402
from serving.protocol import infer_response, parse_infer_request, render  # noqa: E402

MAX_BATCH = 1024  # the Serve ingress's default limit (LimitsSpec.max_batch_size)

torch.set_num_threads(1)
model = load_servable(os.environ["PLAIN_ARTIFACT"])
name_served = os.environ.get("PLAIN_MODEL", "model")
app = FastAPI()


@app.get("/v2/health/ready")
async def ready() -> dict:
    return {"ready": True, "pid": os.getpid()}  # the bench waits until it has seen every worker


@app.post("/v2/models/{name}/infer")
async def infer(name: str, request: Request):
    if name != name_served:
        return JSONResponse({"error": f"unknown model '{name}'; served: {name_served}"}, status_code=404)
    try:
        parsed = parse_infer_request(
            await request.body(), model.input_dim, MAX_BATCH, request.headers.get(HEADER)
        )
    except ProtocolError as err:
        return JSONResponse({"error": err.message}, status_code=err.status)
    with torch.inference_mode():
        probs = model.module(torch.from_numpy(parsed.x)).softmax(dim=1).numpy()
    outputs = {"class": probs.argmax(axis=1).astype(np.int64), "probabilities": probs}
    return render(infer_response(name, parsed.id, outputs, parsed.outputs), parsed)
