"""Cascades: answer an input with the cheapest stage that is confident enough.

Pure functions over probability tensors (no Ray), shared by the serving router and by offline
threshold calibration (``jobs.calibrate``). Every confidence measure is scaled so that larger
means more confident and it lies in [0, 1]; an input goes on to the next stage when its
confidence is strictly below that stage's threshold (threshold 0 never escalates, a threshold
above 1 always does).
"""

import math
from dataclasses import dataclass
from typing import Literal, Optional, Sequence

import torch

ConfidenceMeasure = Literal["max_prob", "margin", "entropy"]
CONFIDENCE_MEASURES: tuple[str, ...] = ("max_prob", "margin", "entropy")


def confidence(probs: torch.Tensor, measure: ConfidenceMeasure) -> torch.Tensor:
    """Per-input confidence of a classifier's softmax output.

    Args:
        probs: [batch, classes] probabilities.
        measure: ``max_prob`` (the top probability), ``margin`` (top minus runner-up, as in
            margin sampling) or ``entropy`` (1 - H(p) / log C, so a one-hot output scores 1 and
            a uniform one 0).

    Returns:
        [batch] confidences in [0, 1].
    """
    if measure == "max_prob":
        return probs.max(dim=-1).values
    if measure == "margin":
        top2 = probs.topk(min(2, probs.shape[-1]), dim=-1).values
        return top2[:, 0] - (top2[:, 1] if top2.shape[1] > 1 else 0.0)
    if measure == "entropy":
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(dim=-1)
        return 1.0 - entropy / math.log(max(probs.shape[-1], 2))
    raise ValueError(
        f"unknown confidence measure {measure!r}; choose one of {', '.join(CONFIDENCE_MEASURES)}"
    )


def escalate(probs: torch.Tensor, threshold: float, measure: ConfidenceMeasure) -> torch.Tensor:
    """[batch] bool: which inputs a stage hands on to the next one (confidence below ``threshold``)."""
    return confidence(probs, measure) < threshold


@dataclass
class CascadeResult:
    """What a cascade decided for each input: the answering stage, its probabilities and confidence."""

    probs: torch.Tensor
    stage: torch.Tensor
    confidence: torch.Tensor

    @property
    def predictions(self) -> torch.Tensor:
        return self.probs.argmax(dim=-1)

    def answered_at(self, stage: int) -> float:
        """Share of inputs answered by ``stage``."""
        return float((self.stage == stage).float().mean()) if len(self.stage) else 0.0


def simulate_cascade(
    stage_probs: Sequence[torch.Tensor], thresholds: Sequence[float], measure: ConfidenceMeasure
) -> CascadeResult:
    """Run a cascade offline over every stage's precomputed probabilities.

    Args:
        stage_probs: One [batch, classes] tensor per stage, for the same inputs.
        thresholds: One per stage except the last (the last stage always answers).
        measure: The confidence measure.

    Returns:
        The cascade's answer for every input, as the online router would give it.
    """
    _check_thresholds(len(stage_probs), thresholds)
    probs = stage_probs[-1].clone()
    stage = torch.full((len(probs),), len(stage_probs) - 1, dtype=torch.long)
    pending = torch.ones(len(probs), dtype=torch.bool)
    for index, (candidate, threshold) in enumerate(zip(stage_probs[:-1], thresholds)):
        stops = pending & ~escalate(candidate, threshold, measure)
        probs[stops], stage[stops] = candidate[stops], index
        pending &= ~stops
    return CascadeResult(probs, stage, confidence(probs, measure))


def calibrate_thresholds(
    stage_probs: Sequence[torch.Tensor],
    labels: torch.Tensor,
    measure: ConfidenceMeasure,
    *,
    target_accuracy: Optional[float] = None,
    target_escalation: Optional[float] = None,
    safety_sd: float = 1.0,
) -> list[float]:
    """Thresholds for every stage but the last, from validation data.

    Exactly one target is given:

    - ``target_accuracy``: the lowest thresholds (the most inputs stopping early) whose cascade
      accuracy on these inputs, less ``safety_sd`` standard deviations, is at least the target.
      Calibrated from the back: stage i's threshold is chosen with the stages after it already
      calibrated, so each choice sees the cascade that will actually run behind it.
    - ``target_escalation``: each stage hands on this share of the inputs that reach it (a
      quantile of its confidences), i.e. a cost budget.

    Why the reserve: the cascade differs from the last stage only where an earlier stage answered
    and disagrees with it; with d such inputs out of n, the accuracy difference measured on other
    data varies by about sqrt(d) / n (binomial). Calibrating to the bare target on finite data
    misses it on held-out data about half the time; ``safety_sd=1`` aims one deviation lower.

    Returns:
        One threshold per stage except the last.
    """
    if (target_accuracy is None) == (target_escalation is None):
        raise ValueError("give exactly one of target_accuracy and target_escalation")
    if target_escalation is not None:
        return _thresholds_for_escalation(stage_probs, measure, target_escalation)
    thresholds: list[float] = []
    for index in reversed(range(len(stage_probs) - 1)):
        rest = stage_probs[index:]
        candidates = torch.unique(confidence(stage_probs[index], measure)).tolist() + [math.inf]

        def meets(threshold: float, rest=rest) -> bool:
            cascade = simulate_cascade(rest, [threshold, *thresholds], measure)
            return _lower_bound(cascade, stage_probs[-1], labels, safety_sd) >= target_accuracy

        thresholds.insert(0, _lowest_meeting(candidates, meets))
    return thresholds


def _lowest_meeting(candidates: list[float], meets) -> float:
    """The smallest sorted candidate threshold that ``meets`` the target (inf: always escalate)."""
    low, high = 0, len(candidates) - 1
    # Accuracy is not exactly monotone in the threshold: binary search, then verify, so the
    # result never misses the target (at worst it escalates everything).
    while low < high:
        middle = (low + high) // 2
        if meets(candidates[middle]):
            high = middle
        else:
            low = middle + 1
    chosen = float(candidates[low])
    return chosen if meets(chosen) else math.inf


def _lower_bound(
    result: CascadeResult, last_probs: torch.Tensor, labels: torch.Tensor, safety_sd: float
) -> float:
    """Accuracy less ``safety_sd`` x sqrt(inputs where the cascade departs from the last stage) / n."""
    departures = int((result.predictions != last_probs.argmax(dim=-1)).sum())
    return _accuracy(result, labels) - safety_sd * math.sqrt(departures) / max(len(labels), 1)


def _thresholds_for_escalation(
    stage_probs: Sequence[torch.Tensor], measure: ConfidenceMeasure, share: float
) -> list[float]:
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"target_escalation must lie in [0, 1], got {share}")
    thresholds: list[float] = []
    reaching = torch.ones(len(stage_probs[0]), dtype=torch.bool)
    for probs in stage_probs[:-1]:
        scores = confidence(probs[reaching], measure)
        threshold = float(torch.quantile(scores, share)) if share > 0 and len(scores) else 0.0
        thresholds.append(threshold if share < 1 else math.inf)
        reaching &= escalate(probs, thresholds[-1], measure)
    return thresholds


def _accuracy(result: CascadeResult, labels: torch.Tensor) -> float:
    return float((result.predictions == labels).float().mean())


def _check_thresholds(num_stages: int, thresholds: Sequence[float]) -> None:
    if num_stages < 1:
        raise ValueError("a cascade needs at least one stage")
    if len(thresholds) != num_stages - 1:
        raise ValueError(
            f"{num_stages} stages need {num_stages - 1} thresholds (every stage but the last), "
            f"got {len(thresholds)}"
        )
