"""MoE gates and balancing losses as pure functions (no Ray, no modules)."""

import pytest
import torch

from scaleforge.routing import gumbel_gate, load_balancing_loss, noisy_topk_gate, router_z_loss, topk_gate


def test_topk_picks_the_largest_and_renormalises():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    routing = topk_gate(logits, k=2)
    assert routing.experts.tolist() == [[1, 3]]
    probs = logits.softmax(-1)[0].tolist()
    assert routing.weights[0].tolist() == pytest.approx(
        [probs[1] / (probs[1] + probs[3]), probs[3] / (probs[1] + probs[3])]
    )
    assert topk_gate(logits, k=1).weights[0].item() == pytest.approx(probs[1])  # Switch: not renormalised


def test_noisy_topk_is_deterministic_without_training_and_noisy_with_it():
    torch.manual_seed(0)
    logits, noise = torch.randn(256, 8), torch.full((256, 8), 2.0)
    quiet = noisy_topk_gate(logits, noise, k=2, training=False)
    assert torch.equal(quiet.experts, logits.topk(2).indices)
    noisy = noisy_topk_gate(logits, noise, k=2, training=True)
    assert not torch.equal(noisy.experts, quiet.experts)
    assert torch.allclose(noisy.weights.sum(-1), torch.ones(256))


def test_gumbel_straight_through_is_hard_forward_soft_backward():
    logits = torch.randn(32, 6, requires_grad=True)
    routing = gumbel_gate(logits, k=2, temperature=0.5, training=True)
    assert torch.allclose(routing.weights, torch.full((32, 2), 0.5))
    (routing.weights[:, 0] * torch.arange(32.0)).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_balancing_loss_is_one_when_uniform_and_larger_when_skewed():
    uniform = load_balancing_loss(torch.full((4,), 0.25), torch.full((4,), 0.25))
    skewed = load_balancing_loss(torch.tensor([1.0, 0, 0, 0]), torch.tensor([0.9, 0.05, 0.03, 0.02]))
    assert uniform.item() == pytest.approx(1.0)
    assert skewed.item() == pytest.approx(3.6)
    assert router_z_loss(torch.zeros(3, 4)).item() == pytest.approx(torch.log(torch.tensor(4.0)).item() ** 2)
