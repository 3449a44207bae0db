"""Routers: served names that answer by calling other served models; what the ingress gives them.

A router kind is one file in :mod:`scaleforge.routers`: its entry (fields, the models it calls, its
trace outputs and request parameters) and its runtime class (the entry's ``router``), which satisfies
:class:`Router` here. The ingress builds every router of the config through :func:`build_router`
and never names a kind.
"""

from typing import Any, Protocol

import numpy as np
import torch
from ray.serve.handle import DeploymentHandle

from scaleforge.routers import RouterEntry
from scaleforge.serving_contract import ModelInfo
from serving.metrics import RoutingMetrics
from serving.models import CoalescingClient, InIngressModel


class Answers(Protocol):
    """What a served name maps to in the ingress: a plain model or a router."""

    async def infer(
        self, x: np.ndarray, parameters: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(outputs by name, the response's ``parameters`` summary) for a checked [batch, input_dim] FP32.

        Raises:
            scaleforge.serving_contract.ProtocolError: a request it refuses (a parameter out of range: 400;
                nothing left to answer with: 503).
        """
        ...


class ServedModels:
    """How a router reaches the models it calls: one call path per model, shared in the replica."""

    def __init__(
        self,
        handles: dict[str, DeploymentHandle],
        clients: "dict[str, CoalescingClient | InIngressModel]",
        infos: dict[str, ModelInfo],
    ):
        self.handles, self.clients, self.infos = handles, clients, infos

    def client(self, name: str) -> "CoalescingClient | InIngressModel":
        """The model's merged call path: ``await client.predict(x)`` gives logits."""
        return self.clients[name]

    def network(self, name: str) -> torch.nn.Module:
        """The loaded network of a model that runs in this replica (``in_ingress``), for a router that
        runs parts of it itself (the config refuses others in the entry's ``check_models``)."""
        return self.clients[name].forward.model.module

    def handle(self, name: str) -> DeploymentHandle:
        """The model's deployment handle, for a router that times and retries each call itself (the
        config refuses ``in_ingress`` for such a router's models in the entry's ``check_models``)."""
        return self.handles[name]


class Router(Answers, Protocol):
    """A router kind's runtime: built once per ingress replica from its entry, then answers requests."""

    def __init__(self, entry: RouterEntry, models: ServedModels, info: ModelInfo, metrics: RoutingMetrics):
        """``entry``: its config entry; ``models``: the models it calls; ``info``: the shapes it
        serves (from :func:`scaleforge.serving_contract.model_infos`); ``metrics``: this replica's."""
        ...


def build_router(entry: RouterEntry, models: ServedModels, metrics: RoutingMetrics) -> Router:
    """The entry's runtime router (``entry.router``), built for this replica."""
    return entry.router(entry, models, models.infos[entry.name], metrics)


__all__ = ["Answers", "Router", "ServedModels", "build_router"]
