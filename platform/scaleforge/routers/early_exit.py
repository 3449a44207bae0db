"""The early-exit router: one network served as a cascade of its own exits (BranchyNet).

The network runs in the ingress replica (its model entry sets ``in_ingress``, which the entry's
``check_models`` asks for). Every input runs the first blocks and the side exit; only the inputs the
side exit is not confident about run the rest of the network, from the first blocks' feature maps
(the network's ``predict``: :meth:`scaleforge.models.early_exit.EarlyExitCNN1d.predict`, the cascade's
policy :func:`scaleforge.routing.escalate` over its exits). So the confident inputs cost a fraction of
a forward pass, and there is one set of weights to serve. Concurrent requests are merged into one pass
per threshold, as the model entry's ``max_batch_size`` and ``batch_wait_timeout_s`` say (as for the
model's own in-ingress calls).
"""

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from scaleforge.routers.base import RouterEntry, Shapes, TensorSpec

if TYPE_CHECKING:
    import torch

    from scaleforge.config.serve import ModelEntry
    from scaleforge.serving_contract import ModelInfo

Answer = tuple[np.ndarray, np.ndarray, np.ndarray]
"""One request's (probabilities, answering exit, its confidence)."""


class EarlyExitRouter:
    """Answers from the side exit where it is confident enough, else from the final exit (``models``:
    the replica's ``serving.routers.ServedModels``; ``metrics``: its ``serving.metrics.RoutingMetrics``)."""

    def __init__(self, entry: "EarlyExitEntry", models: Any, info: "ModelInfo", metrics: Any):
        from ray import serve

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
        import torch

        from scaleforge.serving_contract import split_like

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

    def _count(self, exits: "torch.Tensor") -> None:
        onward = int((exits > 0).sum())
        self.metrics.add(self.metrics.stage_inputs, len(exits), model=self.entry.name, stage="0")
        self.metrics.add(self.metrics.escalations, onward, model=self.entry.name, stage="0")
        self.metrics.add(self.metrics.stage_inputs, onward, model=self.entry.name, stage="1")


class EarlyExitEntry(RouterEntry):
    """A network with several exits (``capabilities.exits > 1``) answering from its side exit when that
    is confident, and running the rest of the network only for the inputs it is not."""

    kind: Literal["early_exit"]
    model: str
    """The served model whose artifact is the network; it runs in the ingress (``in_ingress: true``)."""
    measure: Literal["max_prob", "margin", "entropy"] = "max_prob"
    """Confidence measure at the side exit (see ``scaleforge.routing.confidence``)."""
    threshold: float = Field(ge=0.0)
    """Inputs whose side-exit confidence is below this run the rest of the network (``.inf``: all do;
    ``0``: none do). A request's ``parameters.min_confidence`` overrides it."""

    router = EarlyExitRouter
    trace = (TensorSpec("exit", "INT64", (-1,)), TensorSpec("confidence", "FP32", (-1,)))
    parameters = {"min_confidence": float}

    def models(self) -> list[str]:
        return [self.model]

    def check_models(self, served: dict[str, "ModelEntry"]) -> None:
        if not served[self.model].in_ingress:
            raise ValueError(
                f"early_exit {self.name!r}: model {self.model!r} needs in_ingress: true (the router "
                "runs the network's exits itself, in the ingress replica)"
            )

    def check_manifests(self, manifests: dict[str, dict[str, Any]]) -> None:
        """The network's family must have a side exit: the manifest's model name, asked for its
        capabilities (no weights read)."""
        from scaleforge.config.models import capabilities_of

        family = manifests[self.model]["model"]["name"]
        exits = capabilities_of(family).exits
        if exits < 2:
            raise ValueError(
                f"early_exit {self.name!r}: model {self.model!r} is a {family} network with {exits} "
                "exit; an early-exit router needs a family with at least 2 (capabilities.exits)"
            )

    def served_shapes(self, shapes: dict[str, Shapes]) -> Shapes:
        return shapes[self.model]
