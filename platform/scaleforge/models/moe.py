"""Mixture-of-Experts classifier: a conv stem, sparse MoE blocks, a linear head.

Only the experts a gate selects compute for an input: tokens are dispatched to experts by
index (gather, run, scatter-add), so compute grows with k, not with the number of experts.
Expert parallelism lives in ``scaleforge.distributed.ep``; this file is architecture only.
"""

import math
from typing import Callable, Optional

import torch
from torch import nn

from scaleforge.config.models import MoESpec
from scaleforge.models.cnn1d import conv_blocks
from scaleforge.routing import (
    Routing,
    gumbel_gate,
    load_balancing_loss,
    noisy_topk_gate,
    router_z_loss,
    topk_gate,
)
from scaleforge.routing.capacity import sorted_assignments

ROW_BUCKET = 32
"""An expert's rows are padded: to the next power of two up to this, then to a multiple of it. Every step
routes a different number of tokens to each expert, and on CPU oneDNN builds and caches a kernel for
every new matmul shape (up to 1,024 of them): unpadded, a worker training the MoE language model grew
from 560 to 700 MiB over 60 steps while the dense model stayed flat. Padded, an expert meets at most
``log2(ROW_BUCKET) + capacity / ROW_BUCKET`` shapes. The zero rows' outputs are dropped, so they add
nothing to any gradient."""


def padded_rows(rows: int) -> int:
    """The rows an expert computes for ``rows`` routed ones (:data:`ROW_BUCKET`)."""
    if rows <= ROW_BUCKET:
        return 1 << (rows - 1).bit_length() if rows else 0
    return -(-rows // ROW_BUCKET) * ROW_BUCKET


class Expert(nn.Module):
    """One expert: a two-layer MLP on the routed representation."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        padding = padded_rows(rows) - rows
        if not padding:
            return self.net(x)
        return self.net(nn.functional.pad(x, (0, 0, 0, padding)))[:rows]


# (tokens, routing, experts, capacity) -> (combined output, kept assignments per expert)
Dispatcher = Callable[[torch.Tensor, Routing, nn.ModuleList, int], tuple[torch.Tensor, torch.Tensor]]


class MoELayer(nn.Module):
    """Gate + experts. Call with [tokens, d_model]; returns the weighted sum of the chosen experts.

    After each forward, ``aux_loss`` holds the weighted load-balancing (+ z) loss and the
    ``expert_counts`` / ``dropped`` buffers accumulate routing statistics until reset.
    """

    def __init__(self, spec: MoESpec):
        super().__init__()
        self.spec = spec
        self.num_experts = spec.num_experts
        self.router = nn.Linear(spec.d_model, spec.num_experts, bias=False)
        self.noise = (
            nn.Linear(spec.d_model, spec.num_experts, bias=False) if spec.gate == "noisy_topk" else None
        )
        self.experts = nn.ModuleList(
            Expert(spec.d_model, spec.expert_hidden) for _ in range(spec.num_experts)
        )
        self.dispatcher: Dispatcher = dispatch_local
        # Global statistics hook: sums a tensor over the expert-parallel group (identity locally).
        self.all_reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
        self.register_buffer("expert_counts", torch.zeros(spec.num_experts), persistent=False)
        self.register_buffer("dropped", torch.zeros(()), persistent=False)
        self.register_buffer("routed", torch.zeros(()), persistent=False)
        self.aux_loss = torch.zeros(())

    def route(self, x: torch.Tensor) -> Routing:
        logits = self.router(x)
        if self.spec.gate == "noisy_topk":
            routing = noisy_topk_gate(logits, self.noise(x), self.spec.top_k, self.training)
        elif self.spec.gate == "gumbel":
            routing = gumbel_gate(logits, self.spec.top_k, self.spec.gumbel_temperature, self.training)
        else:
            routing = topk_gate(logits, self.spec.top_k)
        return routing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routing = self.route(x)
        tokens, k = routing.experts.shape
        total_tokens = self.all_reduce(torch.tensor(float(tokens)))
        capacity = (
            _capacity(self.spec.capacity_factor, tokens, k, self.num_experts) if self.training else tokens * k
        )
        out, kept = self.dispatcher(x, routing, self.experts, capacity)
        assigned = torch.bincount(routing.experts.reshape(-1), minlength=self.num_experts).to(x.dtype)
        assigned = self.all_reduce(assigned)
        mean_probs = self.all_reduce(routing.probs.sum(dim=0)) / total_tokens
        self.aux_loss = self.spec.aux_loss_weight * load_balancing_loss(assigned / assigned.sum(), mean_probs)
        if self.spec.z_loss_weight:
            self.aux_loss = self.aux_loss + self.spec.z_loss_weight * router_z_loss(routing.logits)
        with torch.no_grad():
            self.expert_counts += kept.to(self.expert_counts.dtype)
            self.routed += tokens * k
            self.dropped += tokens * k - kept.sum()
        return out

    def reset_stats(self) -> None:
        for buffer in (self.expert_counts, self.dropped, self.routed):
            buffer.zero_()


def _capacity(factor: float, tokens: int, k: int, num_experts: int) -> int:
    return max(1, math.ceil(factor * tokens * k / num_experts))


def dispatch_local(x: torch.Tensor, routing: Routing, experts: nn.ModuleList, capacity: int):
    """Run every expert on exactly the tokens routed to it (all experts in this process).

    One gather, one contiguous slice per expert, one scatter-add: the work is the k chosen
    experts' matmuls, whatever the number of experts.
    """
    _, token, weight, counts = sorted_assignments(routing, len(experts), capacity)
    chunks = x[token].split(counts.tolist())
    outputs = torch.cat([module(chunk) for module, chunk in zip(experts, chunks)])
    return torch.zeros_like(x).index_add(0, token, (outputs * weight[:, None]).to(x.dtype)), counts


def dense_forward(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, masked by the gate: the dense computation that sparse
    dispatch replaces (a reference for tests and benchmarks; no capacity limit)."""
    routing = layer.route(x)
    outputs = torch.stack([expert(x) for expert in layer.experts], dim=1)  # [tokens, experts, d]
    gate = torch.zeros(x.shape[0], layer.num_experts, dtype=x.dtype).scatter(
        1, routing.experts, routing.weights
    )
    return (outputs * gate[..., None]).sum(dim=1)


class MoEClassifier(nn.Module):
    """Conv stem -> d_model representation -> residual MoE blocks -> linear head."""

    def __init__(self, spec: MoESpec, input_dim: int, num_classes: int):
        super().__init__()
        blocks, channels, length = conv_blocks(spec.stem_channels, 5, True, input_dim, "moe")
        self.stem = nn.Sequential(
            *blocks, nn.Flatten(), nn.Linear(channels * length, spec.d_model), nn.ReLU()
        )
        self.norms = nn.ModuleList(nn.LayerNorm(spec.d_model) for _ in range(spec.num_blocks))
        self.moe = nn.ModuleList(MoELayer(spec) for _ in range(spec.num_blocks))
        self.head = nn.Linear(spec.d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x.unsqueeze(1))
        for norm, moe in zip(self.norms, self.moe):
            h = h + moe(norm(h))
        return self.head(h)

    def aux_loss(self) -> torch.Tensor:
        """Sum of the MoE blocks' load-balancing (+ z) losses from the last forward."""
        return auxiliary_loss(self)


def moe_layers(model: nn.Module) -> list[MoELayer]:
    """Every MoE layer inside ``model`` (unwrapping DDP)."""
    return [m for m in model.modules() if isinstance(m, MoELayer)]


def auxiliary_loss(model: nn.Module) -> torch.Tensor | float:
    """Sum of every MoE layer's auxiliary loss from the last forward (0.0 for dense models)."""
    return sum((layer.aux_loss for layer in moe_layers(model)), 0.0)


def expert_load(model: nn.Module) -> Optional[dict[str, object]]:
    """Routing statistics accumulated since the last reset: per-expert counts, CV, dropped share."""
    layers = moe_layers(model)
    if not layers:
        return None
    counts = torch.stack([layer.expert_counts for layer in layers]).sum(dim=0)
    routed = sum(float(layer.routed) for layer in layers)
    dropped = sum(float(layer.dropped) for layer in layers)
    mean = counts.mean()
    return {
        "expert_counts": [int(c) for c in counts.tolist()],
        "load_cv": float(counts.std(unbiased=False) / mean) if mean > 0 else 0.0,
        "max_over_mean_load": float(counts.max() / mean) if mean > 0 else 0.0,
        "dropped_fraction": dropped / routed if routed else 0.0,
    }
