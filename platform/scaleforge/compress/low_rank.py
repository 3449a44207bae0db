"""Low-rank factorization: a Linear's W (out x in) becomes (U sqrt(S)) (sqrt(S) V^T) of rank k."""

from typing import Optional

import torch
from torch import nn

from scaleforge.models.surgery import factorize


def factorize_layers(
    model: nn.Module, layers: list[str], rank: Optional[int] = None, energy: Optional[float] = None
) -> dict[str, int]:
    """Replace each of ``layers`` by its truncated SVD, in place.

    Args:
        model: The model (modified in place).
        layers: Linear layer names.
        rank: Fixed k for every layer, or
        energy: the smallest k whose singular values keep this share of sum(s^2).

    Returns:
        The rank chosen for each layer (recorded in the artifact so the loader rebuilds it).
    """
    ranks = {}
    for name in layers:
        layer = model.get_submodule(name)
        u, s, vh = torch.linalg.svd(layer.weight.detach(), full_matrices=False)
        k = rank if rank is not None else spectral_rank(s, energy)
        root = s[:k].sqrt()
        bias = layer.bias
        pair = factorize(model, name, k)
        with torch.no_grad():
            pair[0].weight.copy_(vh[:k] * root[:, None])
            pair[1].weight.copy_(u[:, :k] * root[None, :])
            if bias is not None:
                pair[1].bias.copy_(bias)
        ranks[name] = k
    return ranks


def spectral_rank(singular_values: torch.Tensor, energy: float) -> int:
    """Smallest k with sum(s[:k]^2) >= energy * sum(s^2)."""
    cumulative = torch.cumsum(singular_values.square(), 0) / singular_values.square().sum()
    return int(torch.searchsorted(cumulative, torch.tensor(energy, dtype=cumulative.dtype)).item()) + 1


def factorized_parameters(model: nn.Module, ranks: dict[str, int]) -> int:
    """Parameters now held by the factorized layers (both thin Linears, biases included)."""
    return sum(p.numel() for name in ranks for p in model.get_submodule(name).parameters())
