"""Routing policies as pure functions over tensors: MoE gates (cascades join later)."""

from scaleforge.routing.gates import (
    Routing,
    gumbel_gate,
    load_balancing_loss,
    noisy_topk_gate,
    router_z_loss,
    topk_gate,
)

__all__ = ["Routing", "topk_gate", "noisy_topk_gate", "gumbel_gate", "load_balancing_loss", "router_z_loss"]
