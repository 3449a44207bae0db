"""MoE routing at serving time: top-k experts per input among those that can take work.

Pure functions over tensors (no Ray). The serving router marks an expert unavailable when it is
saturated (its ongoing requests reached its capacity) or down (a call failed or timed out); an
input whose preferred expert is unavailable goes to its next-best expert in the gate's order.
"""

from dataclasses import dataclass
from typing import Literal

import torch

CombineRule = Literal["topk", "noisy_topk", "gumbel"]


class NoExpertAvailable(RuntimeError):
    """Every expert is saturated or down: the request cannot be answered now."""


@dataclass
class ExpertChoice:
    """Per input: the experts that will answer, their combine weights, and which were fallbacks.

    ``experts`` and ``weights`` are [batch, k]; ``fallback`` is [batch, k] bool, true where the
    expert is not the one the gate preferred in that slot (its preferred one was unavailable);
    ``preferred`` is [batch, k], the gate's own top-k.
    """

    experts: torch.Tensor
    weights: torch.Tensor
    fallback: torch.Tensor
    preferred: torch.Tensor


def fallback_order(gate_logits: torch.Tensor) -> torch.Tensor:
    """[batch, num_experts]: every expert for each input, best first (the order fallbacks follow)."""
    return gate_logits.argsort(dim=-1, descending=True, stable=True)


def choose_experts(
    gate_logits: torch.Tensor, k: int, available: torch.Tensor, combine: CombineRule = "topk"
) -> ExpertChoice:
    """Top-``k`` experts per input, skipping unavailable ones.

    Args:
        gate_logits: [batch, num_experts] router logits from the gate.
        k: Experts per input (``1 <= k <= num_experts``); fewer are used when fewer are available.
        available: [num_experts] bool, false for saturated or down experts.
        combine: How the chosen experts' outputs are weighted: ``topk`` and ``noisy_topk`` (at
            inference, no noise) renormalise the gate's softmax over the chosen experts;
            ``gumbel`` (straight-through hard choice) weights each chosen expert 1/k.

    Returns:
        The choice for every input.

    Raises:
        ValueError: ``k`` is out of range or ``available`` has the wrong length.
        NoExpertAvailable: no expert is available.
    """
    num_experts = gate_logits.shape[-1]
    if not 1 <= k <= num_experts:
        raise ValueError(f"top_k must lie in [1, {num_experts}] (the number of experts), got {k}")
    if available.shape != (num_experts,):
        raise ValueError(
            f"available must have one flag per expert ({num_experts}), got shape {tuple(available.shape)}"
        )
    if not bool(available.any()):
        raise NoExpertAvailable("every expert is saturated or down")
    order = fallback_order(gate_logits)
    usable = min(k, int(available.sum()))
    # Stable sort on "unavailable" keeps the gate's order among the available experts.
    ranked = order.gather(1, (~available[order]).to(torch.int8).argsort(dim=-1, stable=True))
    experts = ranked[:, :usable]
    preferred = order[:, :k]
    fallback = ~(experts[..., None] == preferred[:, None, :]).any(dim=-1)
    return ExpertChoice(experts, _weights(gate_logits, experts, combine), fallback, preferred)


def combine_outputs(expert_logits: torch.Tensor, choice: ExpertChoice) -> torch.Tensor:
    """[batch, classes]: the chosen experts' logits weighted by the gate.

    Args:
        expert_logits: [batch, num_experts, classes]; only the chosen entries are read.
        choice: From :func:`choose_experts`.
    """
    index = choice.experts[..., None].expand(-1, -1, expert_logits.shape[-1])
    return (expert_logits.gather(1, index) * choice.weights[..., None]).sum(dim=1)


def uncomputed_experts(choice: ExpertChoice, computed: torch.Tensor) -> list[int]:
    """The chosen experts whose output is missing for some input (``computed``: [batch, num_experts]
    bool, true where that expert's output for that input exists); empty when the choice can be combined."""
    missing = ~computed.gather(1, choice.experts)
    return sorted(choice.experts[missing].unique().tolist())


def _weights(gate_logits: torch.Tensor, experts: torch.Tensor, combine: CombineRule) -> torch.Tensor:
    if combine == "gumbel":
        return torch.full(experts.shape, 1.0 / experts.shape[1])
    return gate_logits.gather(1, experts).softmax(dim=-1)
