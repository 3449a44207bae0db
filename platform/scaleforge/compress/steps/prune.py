"""``prune``: magnitude pruning, unstructured (zeros) or structured (narrower layers), then fine-tuning
(see :mod:`scaleforge.compress.prune`). Structured pruning writes a ``shapes`` edit."""

from typing import TYPE_CHECKING, Any, Literal, Optional

from pydantic import Field, PositiveInt

from scaleforge.compress.steps.base import (
    CompressionStep,
    Edit,
    FinetuneSpec,
    ModelState,
    Skeleton,
    register_step,
)

if TYPE_CHECKING:
    from torch import nn

    from scaleforge.data.sources import ArraySplits


@register_step
class PruneStep(CompressionStep):
    """Magnitude pruning: unstructured (zeros, via ``torch.nn.utils.prune``) or structured (narrower
    layers)."""

    step: Literal["prune"]
    method: Literal["unstructured", "structured"] = "unstructured"
    """``structured`` removes whole conv channels / neurons (torch-pruning's dependency graph) so layers
    shrink."""
    sparsity: float = Field(ge=0.0, lt=1.0)
    """Unstructured: share of weights set to zero. Structured: share of channels removed from each layer."""
    scope: Literal["global", "layer"] = "global"
    """Unstructured only: rank weights across all ``layers`` at once, or per layer."""
    layers: Optional[list[str]] = None
    """Layers to prune (Linear/Conv1d names such as ``head.1``); default all but the output layer."""
    rounds: PositiveInt = 1
    """Iterative pruning: reach ``sparsity`` in this many equal steps, fine-tuning after each."""
    finetune: FinetuneSpec = Field(default_factory=FinetuneSpec)

    sweepable = ("sparsity",)
    edits = ("shapes",)

    def check(self, skeleton: Skeleton, label: str) -> None:
        import copy

        from torch import nn

        from scaleforge.compress.prune import prune_structured

        skeleton.check_layers(label, self.layers, (nn.Linear, nn.Conv1d))
        if self.method == "structured":
            narrower = copy.deepcopy(skeleton.model)
            skeleton.model = prune_structured(narrower, self.sparsity, self.layers, skeleton.input_dim)

    def apply(self, state: ModelState, data: "ArraySplits") -> tuple[ModelState, dict[str, Any]]:
        from scaleforge.compress.finetune import finetune
        from scaleforge.compress.prune import prune_structured, prune_unstructured, sparsity_of
        from scaleforge.models.surgery import layer_shapes

        model = state.model
        if self.method == "unstructured":
            retrain = lambda m: finetune(m, data.x, data.y, self.finetune)  # noqa: E731
            prune_unstructured(model, self.sparsity, self.layers, self.scope, self.rounds, retrain)
            return state, {"sparsity": sparsity_of(model, self.layers)}
        before = layer_shapes(model)
        prune_structured(model, self.sparsity, self.layers, data.info.input_dim)
        finetune(model, data.x, data.y, self.finetune)
        shapes = layer_shapes(model)
        widths = {
            name: [before[name][-1], shapes[name][-1]] for name in shapes if shapes[name] != before[name]
        }
        edits = state.edits + [{"op": "shapes", "layers": shapes}]
        return ModelState(model, state.spec, edits), {"sparsity": self.sparsity, "widths": widths}

    @classmethod
    def replay(cls, model: "nn.Module", edit: Edit, input_dim: int) -> "nn.Module":
        from scaleforge.models.surgery import apply_shapes

        return apply_shapes(model, edit["layers"])
