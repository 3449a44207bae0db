"""Early-exit router: one network served as a cascade of its own exits (BranchyNet).

The network runs in the ingress replica (its model entry sets ``in_ingress``, which the entry's
``check_models`` asks for). Every input runs the first blocks and the side exit; only the inputs the
side exit is not confident about run the rest of the network, from the first blocks' feature maps
(the network's ``predict``: :meth:`scaleforge.models.early_exit.EarlyExitCNN1d.predict`, the cascade's
policy :func:`scaleforge.routing.escalate` over its exits). So the confident inputs cost a fraction of
a forward pass, and there is one set of weights to serve. Concurrent requests are merged into one pass
per threshold, as the model entry's ``max_batch_size`` and ``batch_wait_timeout_s`` say (as for the
model's own in-ingress calls).
"""

from typing import Any

import numpy as np
import torch
from ray import serve

from scaleforge.config.routers import EarlyExitEntry
from scaleforge.serving_contract import ModelInfo
from serving.metrics import RoutingMetrics
from serving.models import split_like
from serving.routers import ServedModels

Answer = tuple[np.ndarray, np.ndarray, np.ndarray]
"""One request's (probabilities, answering exit, its confidence)."""


class EarlyExitRouter:
    """Answers from the side exit where it is confident enough, else from the final exit."""

    def __init__(self, entry: EarlyExitEntry, models: ServedModels, info: ModelInfo, metrics: RoutingMetrics):
        self.entry, self.metrics = entry, metrics
        self.network = models.network(entry.model)
        batching = models.client(entry.model).entry  # its model entry's, as for its plain forward passes

        @serve.batch(
            max_batch_size=batching.max_batch_size, batch_wait_timeout_s=batching.batch_wait_timeout_s
        )
        async def merged(requests: list[tuple[np.ndarray, float]]) -> list[Answer]:
            return self.run(requests)

        self.predict = merged

    async def infer(
        self, x: np.ndarray, parameters: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Probabilities, the answering exit and its confidence for every input of one request."""
        threshold = float(parameters.get("min_confidence", self.entry.threshold))
        probs, exits, scores = await self.predict((x, threshold))
        outputs = {"class": probs.argmax(axis=1).astype(np.int64), "probabilities": probs}
        summary = {"answered_at_side_exit": int((exits == 0).sum()), "escalated": int((exits > 0).sum())}
        if parameters.get("trace"):
            outputs |= {"exit": exits, "confidence": scores}
        return outputs, summary

    def run(self, requests: list[tuple[np.ndarray, float]]) -> list[Answer]:
        """One pass of the network per distinct threshold among ``requests``, split back per request."""
        answers: list[Answer] = [None] * len(requests)
        for threshold in sorted({t for _, t in requests}):
            chosen = [i for i, (_, t) in enumerate(requests) if t == threshold]
            batches = [requests[i][0] for i in chosen]
            result = self.network.predict(
                torch.from_numpy(np.concatenate(batches)), threshold, self.entry.measure
            )
            parts = [
                split_like(batches, tensor.numpy().astype(dtype))
                for tensor, dtype in (
                    (result.probs, np.float32),
                    (result.stage, np.int64),
                    (result.confidence, np.float32),
                )
            ]
            for i, answer in zip(chosen, zip(*parts)):
                answers[i] = answer
            self._count(result.stage)
        return answers

    def _count(self, exits: torch.Tensor) -> None:
        onward = int((exits > 0).sum())
        self.metrics.add(self.metrics.stage_inputs, len(exits), model=self.entry.name, stage="0")
        self.metrics.add(self.metrics.escalations, onward, model=self.entry.name, stage="0")
        self.metrics.add(self.metrics.stage_inputs, onward, model=self.entry.name, stage="1")
