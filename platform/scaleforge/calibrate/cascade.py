"""Offline calibration of a cascade: thresholds fitted on validation data, returned with what they give.

The stages are loaded exactly as the serving deployments load them
(:func:`scaleforge.artifacts.servable.load_servable`) and routed by the same pure policy
(:mod:`scaleforge.routing.cascade`); the result is measured on the part of the held-out split that
did not pick the thresholds (:func:`scaleforge.calibrate.split.held_out_split`). Nothing is written:
the caller decides where the thresholds go (a pipeline record, or ``jobs.calibrate``'s serve config).
"""

import math
from typing import Literal, Sequence

import torch
from pydantic import BaseModel, ConfigDict

from scaleforge.artifacts.servable import load_servable
from scaleforge.calibrate.split import held_out_split
from scaleforge.config.calibrate import CalibrationSpec
from scaleforge.routing.cascade import calibrate_thresholds, simulate_cascade

CURVE_THRESHOLDS = 41
"""Points of the accuracy-against-cost curve: one threshold for every stage, 0 to 1 in steps of 0.025."""


class CascadePoint(BaseModel):
    """A cascade's result on the judged inputs at one threshold."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    threshold: float
    escalated: float
    """Share of the inputs that the first stage handed on (the cost)."""
    accuracy: float


class CascadeCalibration(BaseModel):
    """Calibrated thresholds and what they give on held-out inputs that did not pick them."""

    # Thresholds may be infinite (``.inf`` sends everything on): written as JSON's Infinity, not null.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    measure: Literal["max_prob", "margin", "entropy"]
    thresholds: list[float]
    """One per stage but the last, rounded to 6 digits (as the serve config holds them)."""
    answered_per_stage: list[float]
    accuracy: float
    last_stage_accuracy: float
    held_out: int
    """Inputs the result was measured on."""
    curve: list[CascadePoint]
    """The same thresholds for every stage, 0 to 1: accuracy against cost, for the report's plot."""

    def summary(self) -> str:
        shares = ", ".join(f"stage {i}: {share:.1%}" for i, share in enumerate(self.answered_per_stage))
        return (
            f"held-out ({self.held_out} inputs): accuracy {self.accuracy:.4f} against "
            f"{self.last_stage_accuracy:.4f} for the last stage alone "
            f"({100 * (self.accuracy - self.last_stage_accuracy):+.2f} points); answered at {shares}"
        )


def calibrate_cascade(artifacts: Sequence[str], measure: str, spec: CalibrationSpec) -> CascadeCalibration:
    """Fit the thresholds of the cascade whose stages (cheapest first) are the model ``artifacts``.

    Args:
        artifacts: Artifact folders or URIs, one per stage.
        measure: The cascade's confidence measure (``max_prob``, ``margin``, ``entropy``).
        spec: The data, its split and the target.
    """
    models = [load_servable(artifact).module for artifact in artifacts]
    split = held_out_split(spec.data, spec.calibration_fraction, spec.split_seed)
    (probs, labels), (judged, judged_labels) = (
        ([_probs(model, x) for model in models], torch.from_numpy(y))
        for x, y in (split.calibration, split.judged)
    )
    target = _accuracy(probs[-1], labels) - spec.accuracy_loss if spec.accuracy_loss is not None else None
    thresholds = calibrate_thresholds(
        probs,
        labels,
        measure,
        target_accuracy=target,
        target_escalation=spec.target_escalation,
        safety_sd=spec.safety_sd,
    )
    thresholds = [t if math.isinf(t) else round(float(t), 6) for t in thresholds]
    result = simulate_cascade(judged, thresholds, measure)
    return CascadeCalibration(
        measure=measure,
        thresholds=thresholds,
        answered_per_stage=[result.answered_at(i) for i in range(len(models))],
        accuracy=_accuracy(result.probs, judged_labels),
        last_stage_accuracy=_accuracy(judged[-1], judged_labels),
        held_out=len(judged_labels),
        curve=_curve(judged, judged_labels, measure),
    )


def _curve(probs: list[torch.Tensor], labels: torch.Tensor, measure: str) -> list[CascadePoint]:
    points = []
    for threshold in torch.linspace(0, 1, CURVE_THRESHOLDS).tolist():
        result = simulate_cascade(probs, [threshold] * (len(probs) - 1), measure)
        points.append(
            CascadePoint(
                threshold=threshold,
                escalated=1 - result.answered_at(0),
                accuracy=_accuracy(result.probs, labels),
            )
        )
    return points


@torch.inference_mode()
def _probs(model, x) -> torch.Tensor:
    return model(torch.from_numpy(x)).softmax(dim=-1)


def _accuracy(probs: torch.Tensor, labels: torch.Tensor) -> float:
    return float((probs.argmax(dim=-1) == labels).float().mean())
