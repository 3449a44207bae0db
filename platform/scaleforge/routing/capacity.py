"""Expert capacity: which token-to-expert assignments fit (GShard/Switch), shared by every dispatcher.

Pure functions over a :class:`~scaleforge.routing.gates.Routing`; the local dispatcher
(``scaleforge.models.moe``) and the expert-parallel one (``scaleforge.distributed.ep``) both use them.
"""

import torch

from scaleforge.routing.gates import Routing


def assignment_order(routing: Routing) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flatten routing choice-major (every token's first choice before any second choice), the
    priority order in which capacity is granted (GShard/Switch).

    Returns:
        (expert, token, weight) per assignment, each of length tokens * k.
    """
    tokens, k = routing.experts.shape
    expert = routing.experts.t().reshape(-1)
    token = torch.arange(tokens, device=expert.device).repeat(k)
    weight = routing.weights.t().reshape(-1)
    return expert, token, weight


def within_capacity(expert: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """Mask of the assignments that fit: the first ``capacity`` per expert in priority order."""
    one_hot = torch.nn.functional.one_hot(expert, num_experts)
    position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=1) - 1
    return position < capacity


def sorted_assignments(routing: Routing, num_experts: int, capacity: int):
    """The assignments that fit in capacity, sorted by expert (stable, so priority order holds).

    Returns:
        (expert, token, weight, counts): per kept assignment, and kept assignments per expert.
    """
    expert, token, weight = assignment_order(routing)
    keep = within_capacity(expert, num_experts, capacity)
    expert, token, weight = expert[keep], token[keep], weight[keep]
    order = torch.argsort(expert, stable=True)
    return expert[order], token[order], weight[order], torch.bincount(expert, minlength=num_experts)
