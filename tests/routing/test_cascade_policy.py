"""Cascade routing policy without Ray: confidence measures, per-input escalation, calibration."""

import math

import pytest
import torch

from scaleforge.routing import calibrate_thresholds, confidence, escalate, simulate_cascade

CONFIDENT, UNSURE, UNIFORM = [0.97, 0.01, 0.01, 0.01], [0.45, 0.4, 0.1, 0.05], [0.25, 0.25, 0.25, 0.25]


def test_confidence_measures_rank_a_peaked_output_above_a_flat_one():
    probs = torch.tensor([CONFIDENT, UNSURE, UNIFORM])
    assert confidence(probs, "max_prob").tolist() == pytest.approx([0.97, 0.45, 0.25])
    assert confidence(probs, "margin").tolist() == pytest.approx([0.96, 0.05, 0.0])
    entropy = confidence(probs, "entropy")
    assert (
        entropy[0] > 0.8
        and entropy[0] > entropy[1] > entropy[2]
        and entropy[2] == pytest.approx(0.0, abs=1e-6)
    )
    assert confidence(torch.eye(4), "entropy").tolist() == pytest.approx([1.0] * 4)
    with pytest.raises(ValueError, match="unknown confidence measure 'variance'"):
        confidence(probs, "variance")


def test_escalation_is_per_input():
    probs = torch.tensor([CONFIDENT, UNSURE, CONFIDENT])
    assert escalate(probs, 0.9, "max_prob").tolist() == [False, True, False]
    assert not escalate(probs, 0.0, "max_prob").any() and escalate(probs, math.inf, "max_prob").all()


def test_simulated_cascade_takes_each_answer_from_its_stopping_stage():
    student = torch.tensor([CONFIDENT, UNSURE, UNSURE])
    middle = torch.tensor([UNSURE, CONFIDENT[::-1], UNSURE])
    teacher = torch.tensor([UNIFORM, UNIFORM, [0.0, 0.0, 1.0, 0.0]])
    result = simulate_cascade([student, middle, teacher], [0.9, 0.9], "max_prob")
    assert result.stage.tolist() == [0, 1, 2]
    assert result.predictions.tolist() == [0, 3, 2]
    assert result.answered_at(0) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="3 stages need 2 thresholds"):
        simulate_cascade([student, middle, teacher], [0.9], "max_prob")


def _stages(n=4000, seed=0):
    """A weak and a strong classifier whose confidence tracks their correctness."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=generator)

    def classifier(skill):
        logits = torch.randn(n, 10, generator=generator)
        logits[torch.arange(n), labels] += skill * torch.rand(n, generator=generator) * 2
        return logits.softmax(dim=1)

    return [classifier(3.0), classifier(8.0)], labels


def test_calibration_meets_the_accuracy_target_with_the_fewest_escalations():
    probs, labels = _stages()
    teacher = float((probs[1].argmax(1) == labels).float().mean())
    (threshold,) = calibrate_thresholds(
        probs, labels, "max_prob", target_accuracy=teacher - 0.01, safety_sd=0.0
    )

    def accuracy(threshold: float) -> float:
        return float((simulate_cascade(probs, [threshold], "max_prob").predictions == labels).float().mean())

    assert accuracy(threshold) >= teacher - 0.01
    lower = confidence(probs[0], "max_prob")
    below = lower[lower < threshold].max()
    assert accuracy(float(below)) < teacher - 0.01  # the next lower threshold would miss the target
    (safer,) = calibrate_thresholds(probs, labels, "max_prob", target_accuracy=teacher - 0.01, safety_sd=2.0)
    assert safer > threshold


def test_calibration_to_an_escalation_budget_and_unreachable_targets():
    probs, labels = _stages()
    (threshold,) = calibrate_thresholds(probs, labels, "margin", target_escalation=0.3)
    assert simulate_cascade(probs, [threshold], "margin").answered_at(1) == pytest.approx(0.3, abs=0.01)
    assert calibrate_thresholds(probs, labels, "max_prob", target_accuracy=1.01) == [math.inf]
    with pytest.raises(ValueError, match="exactly one of target_accuracy and target_escalation"):
        calibrate_thresholds(probs, labels, "max_prob")
