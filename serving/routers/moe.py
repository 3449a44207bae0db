"""MoE router: a gate deployment scores the experts, each input goes to its top-k available experts.

Runs inside the ingress replica; the gate and every expert are separate model deployments. Load
awareness: an expert with ``capacity`` requests in flight from this router is saturated, and one
whose call failed or timed out is down for ``down_for_s``; the inputs that preferred it go to
their next-best expert (:func:`scaleforge.routing.choose_experts`), and ``trace`` reports it.
"""

import asyncio
import time
from typing import Any

import numpy as np
import torch

from scaleforge.config.routers import MoEEntry
from scaleforge.routing import NoExpertAvailable, choose_experts, combine_outputs, uncomputed_experts
from scaleforge.serving_contract import ModelInfo
from serving.metrics import RoutingMetrics
from serving.models import logits_tensor, predict
from serving.protocol import ProtocolError
from serving.routers import ServedModels


class MoERouter:
    """Top-k routing over expert deployments with fallback to the next-best expert."""

    def __init__(self, entry: MoEEntry, models: ServedModels, info: ModelInfo, metrics: RoutingMetrics):
        self.entry, self.metrics, self.num_classes = entry, metrics, info.num_classes
        self.gate = models.handle(entry.gate)
        self.experts = [models.handle(name) for name in entry.experts]
        self.ongoing = [0] * len(self.experts)
        self.down_until = [0.0] * len(self.experts)

    def available(self) -> torch.Tensor:
        """[num_experts] bool: neither saturated nor recently failed."""
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
        self, x: np.ndarray, chosen: torch.Tensor, expert_logits: torch.Tensor, computed: torch.Tensor
    ) -> bool:
        """Run every chosen expert on its not-yet-computed inputs; False if any expert failed."""
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
