"""An MoE classifier split into separately servable parts: one gate and one model per expert.

For a single-block :class:`MoEClassifier`, ``logits = head(h + sum_k w_k E_k(norm(h)))`` with
``h = stem(x)``. Because the head is linear, this equals ``sum_k w_k head(h + E_k(norm(h)))``
whenever the combine weights sum to 1 (top-k with k > 1, noisy top-k, Gumbel). So:

- the **gate** part maps ``x`` to router logits over the experts (stem + norm + router);
- **expert e** is a complete classifier ``x -> head(h + E_e(norm(h)))``: an ``MoEClassifier``
  with that single expert, so each can be deployed on its own;
- a router combines the chosen experts' logits with the gate's weights (:func:`combine_parts`).
"""

import torch
from torch import nn

from scaleforge.config.models import MoEGateSpec, MoESpec
from scaleforge.models.moe import MoEClassifier
from scaleforge.routing import gumbel_gate, topk_gate


class MoEGate(nn.Module):
    """Stem -> LayerNorm -> router: logits over experts (the ``num_classes`` of this model)."""

    def __init__(self, spec: MoEGateSpec, input_dim: int, num_classes: int):
        super().__init__()
        if num_classes != spec.num_experts:
            raise ValueError(f"moe_gate: outputs ({num_classes}) must equal num_experts ({spec.num_experts})")
        body = MoEClassifier(MoESpec(**spec.model_dump(exclude={"name"}) | {"num_blocks": 1}), input_dim, 1)
        self.stem, self.norm, self.router = body.stem, body.norms[0], body.moe[0].router

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.router(self.norm(self.stem(x.unsqueeze(1))))


def split_moe(model: MoEClassifier, spec: MoESpec, input_dim: int, num_classes: int):
    """The gate and one single-expert classifier per expert, with ``model``'s weights.

    Returns:
        ``(gate, gate_spec, [(expert_model, expert_spec), ...])``.
    """
    if spec.num_blocks != 1:
        raise ValueError(
            f"only single-block MoE models split into parts (model.num_blocks={spec.num_blocks})"
        )
    gate_spec = MoEGateSpec(**spec.model_dump(exclude={"name"}))
    gate = MoEGate(gate_spec, input_dim, spec.num_experts)
    gate.load_state_dict({k: v for k, v in _gate_state(model).items()})
    expert_spec = spec.model_copy(
        update={"num_experts": 1, "top_k": 1, "gate": "topk", "aux_loss_weight": 0.0, "z_loss_weight": 0.0}
    )
    experts = []
    for index in range(spec.num_experts):
        single = MoEClassifier(expert_spec, input_dim, num_classes)
        state = {
            k: v
            for k, v in model.state_dict().items()
            if ".experts." not in k and "router" not in k and ".noise." not in k
        }
        state.update(
            {
                k.replace(f"experts.{index}.", "experts.0."): v
                for k, v in model.state_dict().items()
                if f".experts.{index}." in k
            }
        )
        state["moe.0.router.weight"] = torch.zeros(1, spec.d_model)  # one expert: softmax gives weight 1
        single.load_state_dict(state)
        experts.append((single.eval(), expert_spec))
    return gate.eval(), gate_spec, experts


def _gate_state(model: MoEClassifier) -> dict[str, torch.Tensor]:
    state = {f"stem.{k}": v for k, v in model.stem.state_dict().items()}
    state.update({f"norm.{k}": v for k, v in model.norms[0].state_dict().items()})
    state["router.weight"] = model.moe[0].router.weight.detach()
    return state


def combine_parts(gate_logits: torch.Tensor, expert_logits: torch.Tensor, spec: MoESpec) -> torch.Tensor:
    """What a router does with the parts: weight the chosen experts' logits by the gate.

    Args:
        gate_logits: [batch, num_experts] from the gate part.
        expert_logits: [batch, num_experts, num_classes], each expert part's logits.
        spec: The model's routing fields (``gate``, ``top_k``, ``gumbel_temperature``).
    """
    if spec.gate == "gumbel":
        routing = gumbel_gate(gate_logits, spec.top_k, spec.gumbel_temperature, training=False)
    else:  # noisy top-k without training noise is top-k over the clean logits
        routing = topk_gate(gate_logits, spec.top_k)
        if spec.gate == "noisy_topk":
            routing.weights = gate_logits.gather(1, routing.experts).softmax(dim=-1)
    chosen = expert_logits.gather(1, routing.experts[..., None].expand(-1, -1, expert_logits.shape[-1]))
    weights = routing.weights / routing.weights.sum(dim=-1, keepdim=True)
    return (chosen * weights[..., None]).sum(dim=1)
