"""Routing policies as pure functions over tensors: MoE gates, serving-time expert choice, cascades."""

from scaleforge.routing.cascade import (
    CONFIDENCE_MEASURES,
    CascadeResult,
    calibrate_thresholds,
    confidence,
    escalate,
    simulate_cascade,
)
from scaleforge.routing.experts import (
    ExpertChoice,
    NoExpertAvailable,
    choose_experts,
    combine_outputs,
    fallback_order,
    uncomputed_experts,
)
from scaleforge.routing.gates import (
    Routing,
    gumbel_gate,
    load_balancing_loss,
    noisy_topk_gate,
    router_z_loss,
    topk_gate,
)

__all__ = [
    "Routing",
    "topk_gate",
    "noisy_topk_gate",
    "gumbel_gate",
    "load_balancing_loss",
    "router_z_loss",
    "CONFIDENCE_MEASURES",
    "CascadeResult",
    "confidence",
    "escalate",
    "simulate_cascade",
    "calibrate_thresholds",
    "ExpertChoice",
    "NoExpertAvailable",
    "choose_experts",
    "combine_outputs",
    "fallback_order",
    "uncomputed_experts",
]
