"""The cascade's entry: ordered stages, cheapest first; each input stops at the first confident stage."""

from typing import Literal, Optional

from pydantic import Field, model_validator

from scaleforge.config.routers.base import RouterEntry, TensorSpec
from scaleforge.config.schema import _Section


class CascadeStageEntry(_Section):
    model: str
    """A served model's name."""
    threshold: Optional[float] = Field(default=None, ge=0.0)
    """Inputs whose confidence is below this go on to the next stage; the last stage has none.
    ``jobs.calibrate`` writes it. ``.inf`` sends everything on."""


class CascadeEntry(RouterEntry):
    """Ordered stages, cheapest first; each input stops at the first confident stage."""

    kind: Literal["cascade"]
    measure: Literal["max_prob", "margin", "entropy"] = "max_prob"
    """Confidence measure (see ``scaleforge.routing.confidence``)."""
    stages: list[CascadeStageEntry] = Field(min_length=2)

    router = "serving.routers.cascade:CascadeRouter"
    trace = (TensorSpec("stage", "INT64", (-1,)), TensorSpec("confidence", "FP32", (-1,)))
    parameters = {"min_confidence": float, "max_stage": int}

    @model_validator(mode="after")
    def _thresholds(self) -> "CascadeEntry":
        for index, stage in enumerate(self.stages[:-1]):
            if stage.threshold is None:
                raise ValueError(
                    f"cascade {self.name!r}: stage {index} ({stage.model}) needs a threshold "
                    "(run jobs.calibrate, or set one)"
                )
        if self.stages[-1].threshold is not None:
            raise ValueError(f"cascade {self.name!r}: the last stage always answers; remove its threshold")
        return self

    @property
    def thresholds(self) -> list[float]:
        return [stage.threshold for stage in self.stages[:-1]]

    def models(self) -> list[str]:
        return [stage.model for stage in self.stages]

    def placement_hints(self) -> dict[str, Literal["cpu", "gpu"]]:
        """Stage 0 answers most inputs cheaply on a CPU node; the last stage is the large model."""
        return {self.stages[-1].model: "gpu", self.stages[0].model: "cpu"}
