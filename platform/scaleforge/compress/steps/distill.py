"""``distill``: train a registry student on the teacher's softened outputs plus the hard labels
(Hinton et al. 2015), data-parallel on Ray Train (see :mod:`scaleforge.compress.distill`)."""

from typing import TYPE_CHECKING, Literal, Optional

from pydantic import Field, PositiveFloat

from scaleforge.compress.steps.base import (
    CompressionStep,
    ModelState,
    Skeleton,
    StepArtifact,
    StepOutcome,
    register_step,
)
from scaleforge.config.capabilities import either
from scaleforge.config.loader import ConfigError
from scaleforge.config.models import ModelSpec, family_names
from scaleforge.config.schema import OptimSpec

if TYPE_CHECKING:
    from scaleforge.compress.recipe import RecipeRun
    from scaleforge.config.data import TrainDataSpec


@register_step
class DistillStep(CompressionStep):
    """Train ``student`` on the teacher's temperature-softened outputs plus the hard labels
    (Hinton et al. 2015)."""

    step: Literal["distill"]
    student: ModelSpec
    """The student architecture (any registry model; a ``transformer_lm`` for a language model on text,
    trained on the teacher's next-token distribution at every position)."""
    temperature: PositiveFloat = 4.0
    """Softmax temperature of both teacher and student in the soft-target term (Hinton: 2.5-4 for small
    students)."""
    alpha: float = Field(default=0.7, ge=0.0, le=1.0)
    """Weight of the soft-target term; the hard-label cross-entropy gets ``1 - alpha``."""
    optim: OptimSpec = Field(default_factory=lambda: OptimSpec(epochs=10))
    """Student training (data-parallel on Ray Train, ``scaling`` workers)."""
    compare_hard_labels: bool = True
    """Also train the same student on hard labels alone (same epochs and seed) as the baseline."""

    def data_problem(self, data: "TrainDataSpec") -> Optional[str]:
        text = data.kind == "text"
        if text == self.student.capabilities.language_model:
            return None
        if text:
            language_models = either(family_names(lambda c: c.language_model))
            return (
                f"student: text (data.kind=text) distills into a {language_models}, not {self.student.name}"
            )
        return f"student: a {self.student.name} learns from text; set data.kind=text"

    def check(self, skeleton: Skeleton, label: str) -> None:
        from scaleforge.models import build_model

        try:
            skeleton.model = build_model(self.student, skeleton.input_dim, skeleton.num_classes)
        except ValueError as err:  # an architecture that does not fit the teacher's inputs
            raise ConfigError(f"{label}: student: {err}") from None
        skeleton.spec = self.student.model_dump()

    def run(self, recipe: "RecipeRun") -> StepOutcome:
        """Train the student (and the hard-label baseline) from the previous step's artifact."""
        from scaleforge.artifacts import load_artifact
        from scaleforge.compress.distill import distill

        trained = distill(self, recipe.artifact, recipe.cfg, recipe.target)
        artifacts = []
        if trained["hard_labels"]:
            baseline = {"temperature": self.temperature, "alpha": 0.0}
            artifacts.append(
                StepArtifact(
                    f"{recipe.name}-hard-labels", "distill_baseline", trained["hard_labels"], baseline
                )
            )
        details = {"temperature": self.temperature, "alpha": self.alpha}
        artifacts.append(StepArtifact(recipe.name, "distill", trained["student"], details))
        student = load_artifact(trained["student"]).model
        return StepOutcome(ModelState(student, self.student, []), artifacts)
