"""``quantize``: int8 for CPU inference or fp16/bf16 for GPU serving (see
:mod:`scaleforge.compress.quantize`). Writes a ``quantize`` edit; only ``export`` may follow it."""

from typing import TYPE_CHECKING, Any, Literal

from pydantic import PositiveInt

from scaleforge.compress.steps.base import CompressionStep, Edit, ModelState, Skeleton, register_step
from scaleforge.config.capabilities import either
from scaleforge.config.loader import ConfigError
from scaleforge.config.models import capabilities_of, family_names

if TYPE_CHECKING:
    from torch import nn

    from scaleforge.data.sources import ArraySplits


@register_step
class QuantizeStep(CompressionStep):
    """int8 for CPU inference, or fp16/bf16 casting for GPU serving."""

    step: Literal["quantize"]
    scheme: Literal["int8_static", "int8_dynamic", "fp16", "bf16"] = "int8_static"
    """``int8_static``: Conv1d and Linear in int8 with calibrated activations (fast convolutions);
    ``int8_dynamic``: Linear layers only; ``fp16``/``bf16``: cast for GPU serving."""
    calibration_samples: PositiveInt = 2048
    """Training examples run through the model to calibrate int8 activation ranges."""

    sweepable = ("scheme",)
    edits = ("quantize",)

    def check(self, skeleton: Skeleton, label: str) -> None:
        name = skeleton.spec["name"]
        if capabilities_of(name).refuses("quantize", self.scheme):
            able = either(family_names(lambda c, scheme=self.scheme: scheme in c.quant_schemes), "and")
            raise ConfigError(f"{label}: {self.scheme} supports {able} models; use int8_dynamic for {name!r}")
        self.note(skeleton, {"op": "quantize", "scheme": self.scheme})

    def apply(self, state: ModelState, data: "ArraySplits") -> tuple[ModelState, dict[str, Any]]:
        from scaleforge.compress.quantize import float_weight_bytes, quantize_model, quantized_weight_bytes

        float_bytes = float_weight_bytes(state.model, self.scheme)
        model = quantize_model(state.model, self.scheme, data.x[: self.calibration_samples])
        details = {
            "scheme": self.scheme,
            "weight_bytes_before": float_bytes,
            "weight_bytes_after": quantized_weight_bytes(model),
        }
        return ModelState(
            model, state.spec, state.edits + [{"op": "quantize", "scheme": self.scheme}]
        ), details

    @classmethod
    def note(cls, skeleton: Skeleton, edit: Edit) -> None:
        skeleton.frozen = "the model is already quantized; only export can follow quantize"
        skeleton.int8 = edit["scheme"].startswith("int8")

    @classmethod
    def replay(cls, model: "nn.Module", edit: Edit, input_dim: int) -> "nn.Module":
        import torch

        from scaleforge.models.surgery import quantize

        # Observers need one forward to allocate scales; the saved ones overwrite them on load.
        return quantize(model, edit["scheme"], lambda m: m(torch.zeros(2, input_dim)))
