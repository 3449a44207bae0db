"""The bare stage-0 peer of bench/serving.py: the model as a Ray Serve user writes it, V2 handling and
``@serve.batch`` in one FastAPI-ingress replica (the batching settings are our model deployments')."""

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve

from scaleforge.artifacts.servable import load_servable
from scaleforge.config.serve import ModelEntry
from scaleforge.serving_contract import ProtocolError, split_like
from serving.binary import HEADER
from serving.protocol import parse_infer_request
from serving.responses import infer_response, render

THREADS = ModelEntry.model_fields["threads"].default
MAX_BATCH_SIZE = ModelEntry.model_fields["max_batch_size"].default
BATCH_WAIT_S = ModelEntry.model_fields["batch_wait_timeout_s"].default

bare_api = FastAPI()


@serve.deployment
@serve.ingress(bare_api)
class BareModel:
    """The stage-0 model as a Ray Serve user writes it: V2 handling and ``@serve.batch`` in one replica."""

    def __init__(self, artifact: str):
        torch.set_num_threads(THREADS)
        self.model = load_servable(artifact)

    @bare_api.post("/v2/models/{name}/infer")
    async def infer(self, name: str, request: Request):
        try:
            parsed = parse_infer_request(
                await request.body(), self.model.input_dim, 1024, request.headers.get(HEADER)
            )
        except ProtocolError as err:
            return JSONResponse({"error": err.message}, status_code=err.status)
        probs = await self.predict(parsed.x)
        outputs = {"class": probs.argmax(axis=1).astype(np.int64), "probabilities": probs}
        return render(infer_response(name, parsed.id, outputs, None), parsed)

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
    async def predict(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            probs = self.model.module(torch.from_numpy(np.concatenate(batches))).softmax(dim=1).numpy()
        return split_like(batches, probs)
