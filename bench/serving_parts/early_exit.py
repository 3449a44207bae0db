"""The early-exit network of bench/serving.py: the teacher's architecture with a side exit after its
first conv block, trained on both exits' joint loss (BranchyNet), served as one cascade.

Every use of ``scaleforge.models.early_exit`` by the benchmark is in this file."""

import os
import sys
from pathlib import Path

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from safetensors.torch import load_file, save_file

from scaleforge.models.early_exit import EarlyExitCNN1d, joint_loss
from scaleforge.quickfit import fit
from serving.binary import HEADER
from serving.models import split_like
from serving.protocol import ProtocolError, infer_response, parse_infer_request, render
from serving_parts.common import CACHE, EXIT_AFTER, MAX_BATCH_SIZE, TEACHER, THREADS


def load_early_exit(path: str) -> EarlyExitCNN1d:
    model = EarlyExitCNN1d(TEACHER, 40, 10, exit_after=EXIT_AFTER)
    model.load_state_dict(load_file(Path(path) / "model.safetensors"))
    return model.eval()


def exit_logits(path: str, inputs: torch.Tensor) -> list[torch.Tensor]:
    """Both exits' logits (the side exit's, the final exit's) for ``inputs``."""
    return load_early_exit(path).exit_logits(inputs)


def trained_early_exit(data) -> str:
    """The network trained as ``fit_and_save`` trains the teacher, with the joint loss of both exits
    (cached): its folder."""
    path = CACHE / f"early-exit-{EXIT_AFTER}"
    if not (path / "model.safetensors").is_file():
        print(f"training the early-exit network (cached in {path}) ...", file=sys.stderr, flush=True)
        torch.manual_seed(0)
        model = fit(
            EarlyExitCNN1d(TEACHER, 40, 10, exit_after=EXIT_AFTER),
            data["x"],
            data["y"],
            epochs=3,
            batch_size=256,
            lr=3e-3,
            weight_decay=1e-4,
            one_cycle=True,
            loss=joint_loss,
        )
        path.mkdir(parents=True, exist_ok=True)
        save_file(model.state_dict(), str(path / "model.safetensors.tmp"))
        os.replace(path / "model.safetensors.tmp", path / "model.safetensors")
    return str(path)


early_api = FastAPI()  # (a deployment's class is captured as it is declared: what it calls comes first)


@serve.deployment
@serve.ingress(early_api)
class EarlyExitServer:
    """The early-exit network served as one cascade: V2 handling, ``@serve.batch`` and
    ``EarlyExitCNN1d.predict`` in one replica (only the rows its side exit hands on run the rest)."""

    def __init__(self, path: str, threshold: float):
        torch.set_num_threads(THREADS)
        self.model, self.threshold = load_early_exit(path), threshold

    @early_api.post("/v2/models/{name}/infer")
    async def infer(self, name: str, request: Request):
        try:
            parsed = parse_infer_request(await request.body(), 40, 1024, request.headers.get(HEADER))
        except ProtocolError as err:
            return JSONResponse({"error": err.message}, status_code=err.status)
        probs = await self.predict(parsed.x)
        outputs = {"class": probs.argmax(axis=1).astype(np.int64), "probabilities": probs}
        return render(infer_response(name, parsed.id, outputs, None), parsed)

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=0.0)
    async def predict(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        answer = self.model.predict(torch.from_numpy(np.concatenate(batches)), self.threshold)
        return split_like(batches, answer.probs.numpy())
