"""Schemas of threshold calibration: :class:`CalibrationSpec` (what the pipeline's calibrate stage
and ``jobs.calibrate`` share) and :class:`CalibrateConfig` (``jobs.calibrate``, whose pre-flight is
:func:`scaleforge.calibrate.serve_file.check_runnable`)."""

from typing import Optional

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt, model_validator

from scaleforge.config.data import DataSpec
from scaleforge.config.schema import _Section


class CalibrationSpec(_Section):
    """How a cascade's thresholds are fitted: the data, its split, the target."""

    data: DataSpec = Field(default_factory=DataSpec)
    """Labelled data; calibration uses part of its held-out split."""
    calibration_fraction: float = Field(default=0.5, gt=0.0, lt=1.0)
    """Share of the held-out split used to calibrate; the rest measures the result."""
    split_seed: int = 0
    max_accuracy_loss: Optional[float] = Field(default=0.005, ge=0.0, lt=1.0)
    """Target: accuracy at most this far below the last stage alone (0.005 = half a point)."""
    target_escalation: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    """Alternative target: the share of inputs each stage hands on (a cost budget)."""
    safety_sd: NonNegativeFloat = 2.0
    """Standard deviations of the accuracy estimate kept in reserve (see ``calibrate_thresholds``)."""

    @property
    def accuracy_loss(self) -> Optional[float]:
        """The accuracy target in force: ``max_accuracy_loss``, unless ``target_escalation`` replaces it."""
        return None if self.target_escalation is not None else self.max_accuracy_loss


class DraftSearchSpec(_Section):
    """How a generator's ``draft_tokens`` is chosen: each candidate timed on held-out prompts, greedy."""

    candidates: list[NonNegativeInt] = Field(default_factory=lambda: [0, 1, 2, 3, 4, 6, 8], min_length=1)
    """Draft lengths to time (0: the model alone)."""
    prompts: PositiveInt = 8
    """Held-out prompts, from the validation files of the standard library's sources."""
    prompt_bytes: PositiveInt = 32
    new_tokens: PositiveInt = 128
    clients: PositiveInt = 1
    """Requests decoded at a time (1: the latency a single user sees, where drafting pays most)."""
    loads: list[PositiveInt] = Field(default_factory=lambda: [2, 4, 8, 16])
    """Concurrent requests at which the chosen length is timed against none, for ``draft_max_running``."""


class CalibrateConfig(CalibrationSpec):
    """``python -m jobs.calibrate``: fit a cascade's thresholds on validation data, write them into the
    serve config. The main job's calibrate stage reads the same file and uses only the
    :class:`CalibrationSpec` fields (its cascade is ``serve.cascade`` of ``configs/pipeline.yaml``)."""

    serve_config: str = "configs/serve.yaml"
    """The Ray Serve config (a file or a URI) whose cascade is calibrated (rewritten in place, atomically)."""
    application: Optional[str] = None
    """App in ``serve_config`` (default: the first)."""
    cascade: Optional[str] = None
    """Cascade in that app (default: its first)."""
    output: Optional[str] = None
    """Write the calibrated config here instead of over ``serve_config``."""
    generator: Optional[str] = None
    """Calibrate this generator's ``draft_tokens`` (in that app) instead of a cascade's thresholds."""
    draft: DraftSearchSpec = Field(default_factory=DraftSearchSpec)
    """How ``generator``'s draft length is searched."""

    @model_validator(mode="after")
    def _one_target(self) -> "CalibrateConfig":
        if self.generator and self.cascade:
            raise ValueError("give cascade or generator, not both: a run calibrates one router")
        return self
