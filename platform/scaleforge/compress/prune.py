"""Magnitude pruning.

Unstructured zeros (``torch.nn.utils.prune``) or physically narrower layers (torch-pruning).
"""

from typing import Callable, Optional

import torch
import torch.nn.utils.prune as torch_prune
import torch_pruning as tp
from torch import nn

from scaleforge.models.surgery import default_layers, prunable_layers

_PRUNABLE = (nn.Linear, nn.Conv1d)


def prune_unstructured(
    model: nn.Module,
    sparsity: float,
    layers: Optional[list[str]],
    scope: str,
    rounds: int,
    finetune: Callable[[nn.Module], None],
) -> nn.Module:
    """Zero the smallest-magnitude weights of ``layers`` until ``sparsity`` of them are zero.

    Iterative when ``rounds > 1``: each round removes the same share of the surviving weights
    and ``finetune`` runs with the masks in place (pruned weights stay zero while the rest
    adapt). The masks are then folded into the weights (``prune.remove``): permanent, no hooks.
    """
    targets = [(model.get_submodule(name), "weight") for name in layers or default_layers(model, _PRUNABLE)]
    per_round = 1.0 - (1.0 - sparsity) ** (1.0 / rounds)
    for _ in range(rounds):
        # amount is a share of the weights not yet pruned (PruningContainer semantics), so rounds compound.
        if scope == "global":
            remaining = sum(
                int(getattr(module, "weight_mask", module.weight).ne(0).sum()) for module, _ in targets
            )
            torch_prune.global_unstructured(
                targets, pruning_method=torch_prune.L1Unstructured, amount=round(per_round * remaining)
            )
        else:
            for module, name in targets:
                torch_prune.l1_unstructured(module, name, amount=per_round)
        finetune(model)
    for module, name in targets:
        torch_prune.remove(module, name)
    return model


def sparsity_of(model: nn.Module, layers: Optional[list[str]] = None) -> float:
    """Share of exactly-zero weights in ``layers`` (default: all but the output layer)."""
    weights = [model.get_submodule(name).weight for name in layers or default_layers(model, _PRUNABLE)]
    return float(sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights))


def prune_structured(
    model: nn.Module, sparsity: float, layers: Optional[list[str]], input_dim: int
) -> nn.Module:
    """Remove ``sparsity`` of the output channels/neurons of each of ``layers`` (L2-norm ranking).

    torch-pruning's dependency graph also shrinks whatever consumes those channels (the next
    conv's inputs, BatchNorm, the Linear after a Flatten), so every layer is physically
    smaller and latency drops. The output layer is never narrowed.
    """
    targets = set(layers or default_layers(model, _PRUNABLE))
    ignored = [module for name, module in prunable_layers(model).items() if name not in targets]
    pruner = tp.pruner.MetaPruner(
        model,
        torch.zeros(2, input_dim),
        importance=tp.importance.MagnitudeImportance(p=2),
        pruning_ratio=sparsity,
        ignored_layers=ignored,
    )
    pruner.step()
    return model
