"""Apply one local recipe step (prune, low_rank, quantize) to a model, recording what changed.

The same function serves the recipe chain (in the driver) and every sweep point (in a Ray
task), so a sweep point is exactly the step the recipe would run.
"""

import copy
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from torch import nn

from scaleforge.compress.finetune import finetune
from scaleforge.compress.low_rank import factorize_layers, factorized_parameters
from scaleforge.compress.prune import prune_structured, prune_unstructured, sparsity_of
from scaleforge.compress.quantize import float_weight_bytes, quantize_model, quantized_weight_bytes
from scaleforge.config.compress import LowRankStep, PruneStep, QuantizeStep
from scaleforge.data.sources import ArraySplits
from scaleforge.models.surgery import default_layers, layer_shapes


@dataclass
class ModelState:
    """A model on its way through the recipe: registry spec + architecture edits = the exact module tree."""

    model: nn.Module
    spec: BaseModel
    edits: list[dict[str, Any]] = field(default_factory=list)


def apply_step(step, state: ModelState, arrays: ArraySplits) -> tuple[ModelState, dict[str, Any]]:
    """The model after ``step`` (the input is left untouched) and the step's own measurements."""
    model = copy.deepcopy(state.model)
    if isinstance(step, PruneStep) and step.method == "unstructured":
        prune_unstructured(
            model,
            step.sparsity,
            step.layers,
            step.scope,
            step.rounds,
            lambda m: finetune(m, arrays.x, arrays.y, step.finetune),
        )
        return ModelState(model, state.spec, state.edits), {"sparsity": sparsity_of(model, step.layers)}
    if isinstance(step, PruneStep):
        before = layer_shapes(model)
        prune_structured(model, step.sparsity, step.layers, arrays.info.input_dim)
        finetune(model, arrays.x, arrays.y, step.finetune)
        shapes = layer_shapes(model)
        widths = {
            name: [before[name][-1], shapes[name][-1]] for name in shapes if shapes[name] != before[name]
        }
        return (
            ModelState(model, state.spec, state.edits + [{"op": "shapes", "layers": shapes}]),
            {"sparsity": step.sparsity, "widths": widths},
        )
    if isinstance(step, LowRankStep):
        layers = step.layers or default_layers(model, (nn.Linear,))
        before = sum(p.numel() for name in layers for p in model.get_submodule(name).parameters())
        ranks = factorize_layers(model, layers, step.rank, step.energy)
        finetune(model, arrays.x, arrays.y, step.finetune)
        return (
            ModelState(model, state.spec, state.edits + [{"op": "factorize", "ranks": ranks}]),
            {
                "ranks": ranks,
                "factorized_params_before": before,
                "factorized_params_after": factorized_parameters(model, ranks),
            },
        )
    if isinstance(step, QuantizeStep):
        float_bytes = float_weight_bytes(model, step.scheme)
        model = quantize_model(model, step.scheme, arrays.x[: step.calibration_samples])
        return (
            ModelState(model, state.spec, state.edits + [{"op": "quantize", "scheme": step.scheme}]),
            {
                "scheme": step.scheme,
                "weight_bytes_before": float_bytes,
                "weight_bytes_after": quantized_weight_bytes(model),
            },
        )
    raise ValueError(f"step {step.step!r} is not a local step")
