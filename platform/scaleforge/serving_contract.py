"""The serving contract: what a served name is, read from the config and the artifacts' manifests.

Deployment (:mod:`scaleforge.deployment.deploy`, checking an app before Ray starts) and the Serve
app (``serving/``, validating requests and answering metadata) both read the served names from
here; neither asks the other. The routers' runtimes (:mod:`scaleforge.routers`) and the Serve app
share the refusal (:class:`ProtocolError`) and the calls to other replicas from here too.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from scaleforge.config.serve import ServeArgs
from scaleforge.routers import TensorSpec

if TYPE_CHECKING:
    import torch
    from ray.serve.handle import DeploymentHandle

# Light at import (no torch, no Ray): Serve's gRPC proxy imports the protocol, which refuses requests
# with ProtocolError; the functions below import what they call.


class ProtocolError(Exception):
    """A request the server refuses: ``status`` is the HTTP status, ``message`` says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


async def predict(handle: "DeploymentHandle", x: np.ndarray, retries: int = 2) -> np.ndarray:
    """Logits from a model deployment (``serving.models.ModelServer``), retrying when the replica died
    under the request.

    A replica killed mid-request fails that request with ``RayActorError``; inference is
    idempotent, so it is resent (Serve routes it to a live replica) instead of reaching the client.
    """
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import ReplicaUnavailableError

    for _ in range(retries):
        try:
            return await handle.predict.remote(x)
        except (RayActorError, ReplicaUnavailableError):
            continue
    return await handle.predict.remote(x)


def logits_tensor(array: np.ndarray) -> "torch.Tensor":
    """A tensor of logits received from another replica. Arrays out of Ray's object store are
    read-only, which torch cannot share (it warns), so they are copied: a few KB per request."""
    import torch

    return torch.from_numpy(np.array(array))


def split_like(batches: list[np.ndarray], merged: np.ndarray) -> list[np.ndarray]:
    """The rows of ``merged`` (computed on the batches concatenated) back per batch, in order."""
    return np.split(merged, np.cumsum([len(x) for x in batches])[:-1])


@dataclass(frozen=True)
class ModelInfo:
    """What the ingress knows about a served name before calling anything."""

    kind: str
    """``model``, or the router's kind."""
    input_dim: int
    num_classes: int
    trace: tuple[TensorSpec, ...] = ()
    """Outputs added when a request sets ``parameters.trace`` (the router's)."""

    @property
    def outputs(self) -> list[TensorSpec]:
        """Every output a request may ask for: the class, the probabilities, then the trace."""
        return [
            TensorSpec("class", "INT64", (-1,)),
            TensorSpec("probabilities", "FP32", (-1, self.num_classes)),
            *self.trace,
        ]


def model_infos(args: ServeArgs) -> dict[str, ModelInfo]:
    """Shapes of every served name, read from the artifacts' manifests (no weights loaded).

    Raises:
        scaleforge.artifacts.ArtifactError: a model's artifact is missing or malformed.
        ValueError: models that one router combines disagree on shapes, or a router refuses a
            model's artifact (its family, from the manifest).
    """
    from scaleforge.artifacts.servable import manifest_shapes
    from scaleforge.artifacts.store import read_manifest

    manifests = {m.name: read_manifest(m.artifact) for m in args.models}
    shapes = {name: manifest_shapes(manifest) for name, manifest in manifests.items()}
    infos = {name: ModelInfo("model", *shape) for name, shape in shapes.items()}
    for router in args.routers:
        router.check_manifests({name: manifests[name] for name in router.models()})
        infos[router.name] = ModelInfo(router.kind, *router.served_shapes(shapes), trace=router.trace)
    return infos
