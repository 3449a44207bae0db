"""The cascade: ordered stages, cheapest first; each input stops at the first confident stage.

Its runtime runs inside the ingress replica (no extra hop); each stage is its own model deployment,
scaled independently, or runs in the ingress itself (``in_ingress``: a cheap stage 0 then costs no
hop). The policy itself is :func:`scaleforge.routing.escalate`, the same function the offline
calibration uses.
"""

import time
from typing import TYPE_CHECKING, Any, Literal, Optional

import numpy as np
from pydantic import Field, model_validator

from scaleforge.routers.base import RouterEntry, Section, TensorSpec

if TYPE_CHECKING:
    from scaleforge.serving_contract import ModelInfo


class CascadeRouter:
    """Sends each input through the stages until one is confident enough (``models``: the replica's
    ``serving.routers.ServedModels``; ``metrics``: its ``serving.metrics.RoutingMetrics``)."""

    def __init__(self, entry: "CascadeEntry", models: Any, info: "ModelInfo", metrics: Any):
        self.entry, self.metrics = entry, metrics
        self.stages = [models.client(name) for name in entry.models()]

    def thresholds(self, parameters: dict[str, Any]) -> list[float]:
        """Per-stage thresholds for this request: ``min_confidence`` overrides the calibrated ones."""
        if "min_confidence" in parameters:
            return [float(parameters["min_confidence"])] * (len(self.stages) - 1)
        return self.entry.thresholds

    def last_stage(self, parameters: dict[str, Any]) -> int:
        """The costliest stage this request may reach (``max_stage``, a cost cap)."""
        from scaleforge.serving_contract import ProtocolError

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
        import torch

        from scaleforge.routing import confidence, escalate

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
        outputs = {"class": probs.argmax(axis=1).astype(np.int64), "probabilities": probs}
        summary = {"answered_at_stage_0": int((stage == 0).sum()), "escalated": int((stage > 0).sum())}
        if parameters.get("trace"):
            scores = confidence(torch.from_numpy(probs), self.entry.measure).numpy().astype(np.float32)
            outputs |= {"stage": stage, "confidence": scores}
        return outputs, summary

    async def _run_stage(self, index: int, x: np.ndarray) -> np.ndarray:
        from scaleforge.serving_contract import logits_tensor

        start = time.perf_counter()
        logits = await self.stages[index].predict(x)
        self.metrics.stage_latency.observe(1e3 * (time.perf_counter() - start), tags=self._tags(index))
        self.metrics.add(self.metrics.stage_inputs, len(x), **self._tags(index))
        return logits_tensor(logits).softmax(dim=-1).numpy()

    def _tags(self, index: int) -> dict[str, str]:
        return {"model": self.entry.name, "stage": str(index)}


class CascadeStageEntry(Section):
    model: str
    """A served model's name."""
    threshold: Optional[float] = Field(default=None, ge=0.0)
    """Inputs whose confidence is below this go on to the next stage; the last stage has none.
    ``jobs.calibrate`` writes it. ``.inf`` sends everything on."""


class CascadeEntry(RouterEntry):
    """Ordered stages, cheapest first; each input stops at the first confident stage."""

    kind: Literal["cascade"]
    measure: Literal["max_prob", "margin", "entropy"] = "max_prob"
    """Confidence measure (see ``scaleforge.routing.confidence``)."""
    stages: list[CascadeStageEntry] = Field(min_length=2)

    router = CascadeRouter
    trace = (TensorSpec("stage", "INT64", (-1,)), TensorSpec("confidence", "FP32", (-1,)))
    parameters = {"min_confidence": float, "max_stage": int}

    @model_validator(mode="after")
    def _thresholds(self) -> "CascadeEntry":
        for index, stage in enumerate(self.stages[:-1]):
            if stage.threshold is None:
                raise ValueError(
                    f"cascade {self.name!r}: stage {index} ({stage.model}) needs a threshold "
                    "(run jobs.calibrate, or set one)"
                )
        if self.stages[-1].threshold is not None:
            raise ValueError(f"cascade {self.name!r}: the last stage always answers; remove its threshold")
        return self

    @property
    def thresholds(self) -> list[float]:
        return [stage.threshold for stage in self.stages[:-1]]

    def models(self) -> list[str]:
        return [stage.model for stage in self.stages]

    def placement_hints(self) -> dict[str, Literal["cpu", "gpu"]]:
        """Stage 0 answers most inputs cheaply on a CPU node; the last stage is the large model."""
        return {self.stages[-1].model: "gpu", self.stages[0].model: "cpu"}
