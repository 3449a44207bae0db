"""A model artifact served as a deployment: dynamic batching with ``@serve.batch``.

:func:`load_model` is the one place a served model is read from disk, so other artifact kinds
(the compression stage's int8 students) plug in here without touching the routers.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle
from torch import nn

from scaleforge.artifacts import load_artifact, read_manifest
from scaleforge.config.serve import ModelEntry


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to run, with the shapes the HTTP layer validates against."""

    module: nn.Module
    input_dim: int
    num_classes: int


def load_model(artifact: str | Path) -> LoadedModel:
    """Read a served model from its artifact (checksum-verified; no pickle)."""
    loaded = load_artifact(artifact)
    return LoadedModel(loaded.model.eval(), int(loaded.manifest["input_dim"]), int(loaded.manifest["num_classes"]))


def model_shapes(artifact: str | Path) -> tuple[int, int]:
    """(input_dim, num_classes) from the manifest alone: the ingress validates requests with them."""
    manifest = read_manifest(Path(artifact).expanduser())
    return int(manifest["input_dim"]), int(manifest["num_classes"])


async def predict(handle: DeploymentHandle, x: np.ndarray, retries: int = 2) -> np.ndarray:
    """Logits from a :class:`ModelServer`, retrying when the replica died under the request.

    A replica killed mid-request fails that request with ``RayActorError``; inference is
    idempotent, so it is resent (Serve routes it to a live replica) instead of reaching the client.
    """
    for _ in range(retries):
        try:
            return await handle.predict.remote(x)
        except (RayActorError, ReplicaUnavailableError):
            continue
    return await handle.predict.remote(x)


@serve.deployment
class ModelServer:
    """One model; concurrent requests are merged into one forward pass (dynamic batching).

    Returns logits, not probabilities: a cascade takes the softmax, an MoE router combines the
    experts' logits and a gate's logits are routing scores.
    """

    def __init__(self, entry: ModelEntry):
        torch.set_num_threads(entry.threads)
        self.model = load_model(entry.artifact)
        self.predict.set_max_batch_size(entry.max_batch_size)
        self.predict.set_batch_wait_timeout_s(entry.batch_wait_timeout_s)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.002)
    async def predict(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        """[rows, input_dim] float32 per request -> [rows, num_classes] float32 logits per request."""
        sizes = np.cumsum([len(x) for x in batches])[:-1]
        with torch.inference_mode():
            logits = self.model.module(torch.from_numpy(np.concatenate(batches))).numpy()
        return np.split(logits, sizes)

    def ready(self) -> bool:
        return True
