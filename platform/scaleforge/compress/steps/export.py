"""``export``: the recipe's last step writes the artifact (always) and, if asked, ``model.onnx`` beside it
(see :mod:`scaleforge.compress.onnx`)."""

from typing import TYPE_CHECKING, Literal

from scaleforge.compress.steps.base import CompressionStep, Skeleton, StepArtifact, StepOutcome, register_step
from scaleforge.config.loader import ConfigError

if TYPE_CHECKING:
    from scaleforge.compress.recipe import RecipeRun


@register_step
class ExportStep(CompressionStep):
    """Write the artifact (always done); optionally also ONNX for edge runtimes."""

    step: Literal["export"]
    onnx: bool = False
    """Also write ``model.onnx`` next to the artifact (fp32 and fp16 models; int8 eager modules do not
    export)."""

    changes_model = False

    def check(self, skeleton: Skeleton, label: str) -> None:
        if not skeleton.last:
            raise ConfigError(f"{label}: export must be the last step")
        if self.onnx and skeleton.int8:
            raise ConfigError(
                f"{label}: onnx export takes fp32 or half-precision models, not eager int8 modules"
            )

    def run(self, recipe: "RecipeRun") -> StepOutcome:
        from scaleforge import storage
        from scaleforge.compress.onnx import export_onnx

        path = recipe.save(recipe.state, {"step": "export"})
        if self.onnx:
            onnx = storage.join(recipe.target, "model.onnx")
            export_onnx(recipe.state.model, onnx, recipe.data.info.input_dim, recipe.data.vocab)
        return StepOutcome(recipe.state, [StepArtifact(recipe.name, "export", path, {"onnx": self.onnx})])
