"""Mixture-of-Experts gates: which experts each token goes to, and with what weight.

Pure functions over tensors (no modules, no Ray), shared by training and the serving router.
Each returns a :class:`Routing`: ``experts`` [tokens, k] indices, ``weights`` [tokens, k]
combine weights, ``probs`` [tokens, num_experts], the router distribution that the
load-balancing loss uses, and the raw ``logits`` (for the z-loss).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Routing:
    experts: torch.Tensor
    weights: torch.Tensor
    probs: torch.Tensor
    logits: torch.Tensor


def topk_gate(logits: torch.Tensor, k: int) -> Routing:
    """Softmax top-k (Switch Transformer for k=1; renormalised over the chosen k for k>1, as GShard)."""
    probs = logits.softmax(dim=-1)
    weights, experts = probs.topk(k, dim=-1)
    if k > 1:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return Routing(experts, weights, probs, logits)


def noisy_topk_gate(logits: torch.Tensor, noise_logits: torch.Tensor, k: int, training: bool) -> Routing:
    """Noisy top-k gating (Shazeer et al. 2017, eq. 3-5).

    H = logits + N(0, 1) * softplus(noise_logits) while training; keep the top k of H and
    softmax over those k only.
    """
    noisy = logits + torch.randn_like(logits) * F.softplus(noise_logits) if training else logits
    top, experts = noisy.topk(k, dim=-1)
    return Routing(experts, top.softmax(dim=-1), noisy.softmax(dim=-1), logits)


def gumbel_gate(logits: torch.Tensor, k: int, temperature: float, training: bool) -> Routing:
    """Gumbel-softmax with a straight-through estimator (Jang et al. 2017).

    Forward: a hard choice of k experts, each weighted 1/k. Backward: gradients of the relaxed
    softmax((logits + Gumbel noise) / temperature). Without training, no noise.
    """
    noise = -torch.empty_like(logits).exponential_().log() if training else torch.zeros_like(logits)
    soft = ((logits + noise) / temperature).softmax(dim=-1)
    soft_top, experts = soft.topk(k, dim=-1)
    hard = torch.full_like(soft_top, 1.0 / k)
    return Routing(experts, hard + soft_top - soft_top.detach(), logits.softmax(dim=-1), logits)


def load_balancing_loss(expert_fraction: torch.Tensor, mean_probs: torch.Tensor) -> torch.Tensor:
    """Switch Transformer auxiliary loss N * sum_i f_i * P_i (before its alpha weight).

    Args:
        expert_fraction: f_i, the share of routing assignments sent to expert i.
        mean_probs: P_i, the mean router probability of expert i over the tokens.

    Returns:
        A scalar that is 1.0 under perfectly uniform routing and grows with imbalance.
    """
    return expert_fraction.numel() * torch.sum(expert_fraction * mean_probs)


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE router z-loss: mean squared log-partition, keeps router logits small."""
    return torch.logsumexp(logits, dim=-1).pow(2).mean()
