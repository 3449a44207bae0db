"""Serving-time MoE expert choice without Ray: top-k among available experts, fallback order."""

import pytest
import torch

from scaleforge.models import MoESpec
from scaleforge.models.moe_parts import combine_parts
from scaleforge.routing import (
    NoExpertAvailable,
    choose_experts,
    combine_outputs,
    fallback_order,
    uncomputed_experts,
)

LOGITS = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
ALL = torch.ones(4, dtype=torch.bool)


def test_top_k_follows_the_gate_when_every_expert_is_available():
    choice = choose_experts(LOGITS, 2, ALL)
    assert choice.experts.tolist() == [[0, 1], [3, 2]]
    assert not choice.fallback.any()
    assert torch.allclose(choice.weights.sum(dim=1), torch.ones(2))
    assert choice.weights[0, 0] == pytest.approx(torch.tensor([3.0, 2.0]).softmax(0)[0].item())


def test_an_unavailable_expert_is_replaced_by_the_next_best():
    down = torch.tensor([True, False, True, True])
    choice = choose_experts(LOGITS, 2, down)
    assert choice.experts.tolist() == [[0, 2], [3, 2]]
    assert choice.fallback.tolist() == [[False, True], [False, False]]
    assert fallback_order(LOGITS)[0].tolist() == [0, 1, 2, 3]


def test_fewer_available_experts_than_k_and_none_at_all():
    only_one = torch.tensor([False, False, True, False])
    choice = choose_experts(LOGITS, 3, only_one)
    assert choice.experts.tolist() == [[2], [2]] and choice.weights.tolist() == [[1.0], [1.0]]
    with pytest.raises(NoExpertAvailable):
        choose_experts(LOGITS, 2, torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"top_k must lie in \[1, 4\]"):
        choose_experts(LOGITS, 5, ALL)


def test_combined_outputs_match_the_moe_parts_rule():
    torch.manual_seed(0)
    gate, experts = torch.randn(8, 4), torch.randn(8, 4, 10)
    spec = MoESpec(num_experts=4, top_k=2)
    combined = combine_outputs(experts, choose_experts(gate, 2, ALL))
    assert torch.allclose(combined, combine_parts(gate, experts, spec), atol=1e-6)


def test_an_answer_is_combined_only_from_experts_that_computed_every_input_they_were_chosen_for():
    """The router answers 503 naming these experts instead of combining the zeros they left."""
    choice = choose_experts(LOGITS, 2, ALL)  # input 0 -> experts 0, 1; input 1 -> experts 3, 2
    computed = torch.ones(2, 4, dtype=torch.bool)
    assert uncomputed_experts(choice, computed) == []
    computed[1, 2] = False  # expert 2 failed on its last attempt for input 1
    computed[0, 2] = False  # not chosen for input 0: irrelevant
    assert uncomputed_experts(choice, computed) == [2]
    computed[0, 0] = False
    assert uncomputed_experts(choice, computed) == [0, 2]
