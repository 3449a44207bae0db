"""The MoE router: a gate model picks top-k expert models per input; their outputs are combined.

Its runtime runs inside the ingress replica; the gate and every expert are separate model
deployments. Load awareness: an expert with ``capacity`` requests in flight from this router is
saturated, and one whose call failed or timed out is down for ``down_for_s``; the inputs that
preferred it go to their next-best expert (:func:`scaleforge.routing.choose_experts`), and ``trace``
reports it.
"""

import asyncio
import time
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from scaleforge.routers.base import RouterEntry, Shapes, TensorSpec, same_shapes

if TYPE_CHECKING:
    import torch

    from scaleforge.config.serve import ModelEntry
    from scaleforge.serving_contract import ModelInfo


class MoERouter:
    """Top-k routing over expert deployments with fallback to the next-best expert (``models``: the
    replica's ``serving.routers.ServedModels``; ``metrics``: its ``serving.metrics.RoutingMetrics``)."""

    def __init__(self, entry: "MoEEntry", models: Any, info: "ModelInfo", metrics: Any):
        self.entry, self.metrics, self.num_classes = entry, metrics, info.num_classes
        self.gate = models.handle(entry.gate)
        self.experts = [models.handle(name) for name in entry.experts]
        self.ongoing = [0] * len(self.experts)
        self.down_until = [0.0] * len(self.experts)

    def available(self) -> "torch.Tensor":
        """[num_experts] bool: neither saturated nor recently failed."""
        import torch

        now = time.monotonic()
        return torch.tensor(
            [
                self.ongoing[e] < self.entry.capacity and self.down_until[e] <= now
                for e in range(len(self.experts))
            ]
        )

    async def infer(
        self, x: np.ndarray, parameters: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Combined probabilities for every input; with ``trace``, the experts used and the fallbacks."""
        import torch

        from scaleforge.routing import NoExpertAvailable, choose_experts, combine_outputs, uncomputed_experts
        from scaleforge.serving_contract import ProtocolError, logits_tensor, predict

        k = parameters.get("top_k", self.entry.top_k)
        if not 1 <= k <= len(self.experts):
            raise ProtocolError(
                400,
                f"parameters.top_k must lie in [1, {len(self.experts)}] for MoE router "
                f"'{self.entry.name}', got {k}",
            )
        gate_logits = logits_tensor(await predict(self.gate, x))
        expert_logits = torch.zeros(len(x), len(self.experts), self.num_classes)
        computed = torch.zeros(len(x), len(self.experts), dtype=torch.bool)
        # Each pass routes around the experts that failed in the previous one; the outputs
        # already computed are kept, so only the inputs of a failed expert are redone.
        for _ in range(len(self.experts)):
            try:
                choice = choose_experts(gate_logits, k, self.available(), self.entry.combine)
            except NoExpertAvailable:
                raise ProtocolError(
                    503, f"MoE router '{self.entry.name}': every expert is saturated or down; retry later"
                ) from None
            if await self._compute(x, choice.experts, expert_logits, computed):
                break
        if missing := uncomputed_experts(choice, computed):  # never combine zeros for an expert that failed
            names = ", ".join(self.entry.experts[e] for e in missing)
            raise ProtocolError(
                503, f"MoE router '{self.entry.name}': expert(s) {names} failed on every attempt; retry later"
            )
        probs = combine_outputs(expert_logits, choice).softmax(dim=-1).numpy()
        self._count_fallbacks(choice)
        outputs = {"class": probs.argmax(axis=1).astype(np.int64), "probabilities": probs.astype(np.float32)}
        summary = {"fallbacks": int(choice.fallback.sum()), "top_k": k}
        if parameters.get("trace"):
            outputs |= {
                "experts": choice.experts.numpy().astype(np.int64),
                "fallback": choice.fallback.numpy(),
            }
        return outputs, summary

    async def _compute(
        self, x: np.ndarray, chosen: "torch.Tensor", expert_logits: "torch.Tensor", computed: "torch.Tensor"
    ) -> bool:
        """Run every chosen expert on its not-yet-computed inputs; False if any expert failed."""
        from scaleforge.serving_contract import logits_tensor

        work = []
        for expert in chosen.unique().tolist():
            rows = ((chosen == expert).any(dim=1) & ~computed[:, expert]).nonzero().flatten()
            if len(rows):
                work.append((expert, rows))
        results = await asyncio.gather(
            *(self._call(e, x[rows.numpy()]) for e, rows in work), return_exceptions=True
        )
        ok = True
        for (expert, rows), result in zip(work, results):
            if isinstance(result, BaseException):
                self.down_until[expert] = time.monotonic() + self.entry.down_for_s
                self.metrics.add(self.metrics.expert_failures, 1, **self._tags(expert))
                ok = False
                continue
            expert_logits[rows, expert] = logits_tensor(result)
            computed[rows, expert] = True
            self.metrics.add(self.metrics.expert_inputs, len(rows), **self._tags(expert))
        return ok

    async def _call(self, expert: int, x: np.ndarray) -> np.ndarray:
        from scaleforge.serving_contract import predict

        self.ongoing[expert] += 1
        try:
            return await asyncio.wait_for(
                predict(self.experts[expert], x, retries=0), self.entry.expert_timeout_s
            )
        finally:
            self.ongoing[expert] -= 1

    def _count_fallbacks(self, choice) -> None:
        for expert in choice.experts[choice.fallback].unique().tolist():
            amount = int((choice.experts[choice.fallback] == expert).sum())
            self.metrics.add(self.metrics.fallbacks, amount, **self._tags(expert))

    def _tags(self, expert: int) -> dict[str, str]:
        return {"model": self.entry.name, "expert": str(expert)}


class MoEEntry(RouterEntry):
    """A gate model picks top-k expert models per input; their outputs are combined by the gate's weights."""

    kind: Literal["moe"]
    gate: str
    """The served gate model (outputs one logit per expert)."""
    experts: list[str] = Field(min_length=1)
    """Served expert models, in the gate's expert order."""
    top_k: PositiveInt = 2
    """Default experts per input (a request may override it)."""
    combine: Literal["topk", "noisy_topk", "gumbel"] = "topk"
    """The gate family the experts were trained with (how the weights are formed)."""
    capacity: PositiveInt = 8
    """Ongoing requests per expert (per router replica) before it counts as saturated."""
    expert_timeout_s: PositiveFloat = 2.0
    """An expert that has not answered in this time counts as down; its inputs fall back."""
    down_for_s: NonNegativeFloat = 5.0
    """How long a failed expert is skipped before it is tried again."""

    router = MoERouter
    trace = (TensorSpec("experts", "INT64", (-1, -1)), TensorSpec("fallback", "BOOL", (-1, -1)))
    parameters = {"top_k": int}

    @model_validator(mode="after")
    def _k(self) -> "MoEEntry":
        if self.top_k > len(self.experts):
            raise ValueError(
                f"moe {self.name!r}: top_k ({self.top_k}) exceeds the number of experts ({len(self.experts)})"
            )
        return self

    def models(self) -> list[str]:
        return [self.gate, *self.experts]

    def check_models(self, served: dict[str, "ModelEntry"]) -> None:
        inside = [name for name in self.models() if served[name].in_ingress]
        if inside:
            raise ValueError(
                f"moe {self.name!r}: {', '.join(inside)} set in_ingress; a router calls its gate and "
                "experts as deployments (each with its own timeout and fallback)"
            )

    def served_shapes(self, shapes: dict[str, Shapes]) -> Shapes:
        """The experts' shapes; the gate maps the same features to one score per expert."""
        input_dim, num_classes = same_shapes(self.describe(), self.experts, shapes)
        gate_in, gate_out = shapes[self.gate]
        if gate_out != len(self.experts) or gate_in != input_dim:
            raise ValueError(
                f"moe {self.name!r}: gate '{self.gate}' maps {gate_in} features to "
                f"{gate_out} scores; it needs {input_dim} features and one score "
                f"per expert ({len(self.experts)})"
            )
        return input_dim, num_classes
