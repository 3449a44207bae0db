"""Activation checkpointing (``parallel.activation_checkpointing``): a transformer layer's activations
are dropped after its forward pass and recomputed in backward, trading compute for memory.

- ``full``: a layer keeps only its input; everything inside it runs again in backward
  (``torch.utils.checkpoint``, non-reentrant, RNG state restored so dropout masks repeat);
- ``selective``: per op, as torchtitan's ``op`` mode does: the outputs of matrix multiplications and
  attention (and of collectives, under tensor parallelism) are kept, the cheap element-wise ops
  (norms, activations, dropout, residual adds) recomputed;
- ``none``: every activation is kept.

The layer checkpoints inside its own ``forward`` (as Hugging Face's ``gradient_checkpointing_enable``
does), so no wrapper module renames a parameter: tensor-parallel plans, FSDP units, pipeline stages
and checkpoints see the same names with it on or off, and FSDP's hooks gather a unit's parameters
around the recomputation as they do around its backward.
"""

from functools import partial
from typing import Callable, Literal

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

Recompute = Literal["none", "selective", "full"]

_aten = torch.ops.aten
_KEPT_BY_SELECTIVE = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention.default,
    *(
        getattr(torch.ops._c10d_functional, name).default
        for name in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor")
        if hasattr(torch.ops._c10d_functional, name)
    ),
}
"""Ops whose outputs selective checkpointing keeps: the expensive ones (and a collective, which a
recomputation would otherwise run again)."""


def _keep_expensive(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _KEPT_BY_SELECTIVE else CheckpointPolicy.PREFER_RECOMPUTE


def run_layer(recompute: Recompute, forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor):
    """``forward(x)``, its activations dropped and recomputed in backward as ``recompute`` says (only
    while autograd records: evaluation runs the layer as it is)."""
    if recompute == "none" or not torch.is_grad_enabled():
        return forward(x)
    if recompute == "full":
        return checkpoint(forward, x, use_reentrant=False)
    return checkpoint(
        forward,
        x,
        use_reentrant=False,
        context_fn=partial(create_selective_checkpoint_contexts, _keep_expensive),
    )


def set_activation_checkpointing(model: nn.Module, recompute: Recompute) -> int:
    """Checkpoint every layer of ``model`` that can (``recompute`` attribute) as ``recompute`` says.

    Returns:
        How many layers were set.

    Raises:
        ValueError: ``recompute`` is not ``none`` and the model has no such layer.
    """
    layers = [module for module in model.modules() if hasattr(module, "recompute")]
    if recompute != "none" and not layers:
        raise ValueError(
            f"parallel.activation_checkpointing={recompute}: {type(model).__name__} has no transformer "
            "layers to recompute (model.name: transformer or transformer_lm)"
        )
    for layer in layers:
        layer.recompute = recompute
    return len(layers)
