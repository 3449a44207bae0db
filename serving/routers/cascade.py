"""Cascade router: every input starts at stage 0; the unconfident ones go on, per input.

Runs inside the ingress replica (no extra hop); each stage is its own model deployment, scaled
independently, or runs in the ingress itself (``in_ingress``: a cheap stage 0 then costs no hop).
The policy itself is :func:`scaleforge.routing.escalate`, the same function the offline
calibration uses.
"""

import time
from typing import Any

import numpy as np
import torch

from scaleforge.config.routers import CascadeEntry
from scaleforge.routing import confidence, escalate
from scaleforge.serving_contract import ModelInfo
from serving.metrics import RoutingMetrics
from serving.models import logits_tensor
from serving.protocol import ProtocolError
from serving.routers import ServedModels


class CascadeRouter:
    """Sends each input through the stages until one is confident enough."""

    def __init__(self, entry: CascadeEntry, models: ServedModels, info: ModelInfo, metrics: RoutingMetrics):
        self.entry, self.metrics = entry, metrics
        self.stages = [models.client(name) for name in entry.models()]

    def thresholds(self, parameters: dict[str, Any]) -> list[float]:
        """Per-stage thresholds for this request: ``min_confidence`` overrides the calibrated ones."""
        if "min_confidence" in parameters:
            return [float(parameters["min_confidence"])] * (len(self.stages) - 1)
        return self.entry.thresholds

    def last_stage(self, parameters: dict[str, Any]) -> int:
        """The costliest stage this request may reach (``max_stage``, a cost cap)."""
        last = len(self.stages) - 1
        cap = parameters.get("max_stage", last)
        if not 0 <= cap <= last:
            raise ProtocolError(
                400,
                f"parameters.max_stage must lie in [0, {last}] for cascade '{self.entry.name}', got {cap}",
            )
        return cap

    async def infer(
        self, x: np.ndarray, parameters: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Probabilities, the answering stage and its confidence for every input of one request."""
        thresholds, last = self.thresholds(parameters), self.last_stage(parameters)
        probs = np.zeros((len(x), 0), dtype=np.float32)
        stage = np.full(len(x), last, dtype=np.int64)
        pending = np.arange(len(x))
        for index in range(last + 1):
            stage_probs = await self._run_stage(index, x[pending])
            if probs.shape[1] == 0:
                probs = np.zeros((len(x), stage_probs.shape[1]), dtype=np.float32)
            handed_on = (
                escalate(torch.from_numpy(stage_probs), thresholds[index], self.entry.measure).numpy()
                if index < last
                else np.zeros(len(pending), dtype=bool)
            )
            answered = pending[~handed_on]
            probs[answered], stage[answered] = stage_probs[~handed_on], index
            self.metrics.add(self.metrics.escalations, int(handed_on.sum()), **self._tags(index))
            pending = pending[handed_on]
            if not len(pending):
                break
        scores = confidence(torch.from_numpy(probs), self.entry.measure).numpy().astype(np.float32)
        outputs = {"class": probs.argmax(axis=1).astype(np.int64), "probabilities": probs}
        summary = {"answered_at_stage_0": int((stage == 0).sum()), "escalated": int((stage > 0).sum())}
        if parameters.get("trace"):
            outputs |= {"stage": stage, "confidence": scores}
        return outputs, summary

    async def _run_stage(self, index: int, x: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        logits = await self.stages[index].predict(x)
        self.metrics.stage_latency.observe(1e3 * (time.perf_counter() - start), tags=self._tags(index))
        self.metrics.add(self.metrics.stage_inputs, len(x), **self._tags(index))
        return logits_tensor(logits).softmax(dim=-1).numpy()

    def _tags(self, index: int) -> dict[str, str]:
        return {"model": self.entry.name, "stage": str(index)}
