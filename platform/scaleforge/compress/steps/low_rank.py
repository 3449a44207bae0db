"""``low_rank``: a Linear's W (m x n) becomes U V^T of rank k from its truncated SVD, then fine-tuning
(see :mod:`scaleforge.compress.low_rank`). Writes a ``factorize`` edit with each layer's rank."""

from typing import TYPE_CHECKING, Any, Literal, Optional

from pydantic import Field, PositiveInt, model_validator

from scaleforge.compress.steps.base import (
    CompressionStep,
    Edit,
    FinetuneSpec,
    ModelState,
    Skeleton,
    register_step,
)
from scaleforge.config.loader import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from scaleforge.data.sources import ArraySplits


@register_step
class LowRankStep(CompressionStep):
    """Replace Linear weights W (m x n) by U V^T of rank k, then fine-tune."""

    step: Literal["low_rank"]
    layers: Optional[list[str]] = None
    """Linear layers to factorize; default all but the output layer."""
    rank: Optional[PositiveInt] = None
    """Fixed rank k for every listed layer."""
    energy: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    """Or: the smallest k keeping this share of each layer's spectral energy (sum of squared singular
    values)."""
    finetune: FinetuneSpec = Field(default_factory=FinetuneSpec)

    sweepable = ("rank", "energy")
    edits = ("factorize",)

    @model_validator(mode="after")
    def _one_rank_rule(self) -> "LowRankStep":
        if (self.rank is None) == (self.energy is None):
            raise ValueError("give exactly one of rank (fixed k) or energy (spectral energy to keep)")
        return self

    def check(self, skeleton: Skeleton, label: str) -> None:
        from torch import nn

        from scaleforge.models.surgery import default_layers

        skeleton.check_layers(label, self.layers, (nn.Linear,))
        for name in self.layers or default_layers(skeleton.model, (nn.Linear,)):
            layer = skeleton.model.get_submodule(name)
            most = min(layer.in_features, layer.out_features)
            if self.rank is not None and self.rank > most:
                raise ConfigError(
                    f"{label}: rank {self.rank} is larger than layer {name!r} allows "
                    f"({layer.out_features} x {layer.in_features}: at most {most})"
                )

    def apply(self, state: ModelState, data: "ArraySplits") -> tuple[ModelState, dict[str, Any]]:
        from torch import nn

        from scaleforge.compress.finetune import finetune
        from scaleforge.compress.low_rank import factorize_layers, factorized_parameters
        from scaleforge.models.surgery import default_layers

        model = state.model
        layers = self.layers or default_layers(model, (nn.Linear,))
        before = sum(p.numel() for name in layers for p in model.get_submodule(name).parameters())
        ranks = factorize_layers(model, layers, self.rank, self.energy)
        finetune(model, data.x, data.y, self.finetune)
        details = {
            "ranks": ranks,
            "factorized_params_before": before,
            "factorized_params_after": factorized_parameters(model, ranks),
        }
        return ModelState(model, state.spec, state.edits + [{"op": "factorize", "ranks": ranks}]), details

    @classmethod
    def replay(cls, model: "nn.Module", edit: Edit, input_dim: int) -> "nn.Module":
        from scaleforge.models.surgery import factorize

        for name, rank in edit["ranks"].items():
            factorize(model, name, rank)
        return model
