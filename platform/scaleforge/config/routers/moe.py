"""The MoE router's entry: a gate model picks top-k expert models per input."""

from typing import TYPE_CHECKING, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from scaleforge.config.routers.base import RouterEntry, Shapes, TensorSpec, same_shapes

if TYPE_CHECKING:
    from scaleforge.config.serve import ModelEntry


class MoEEntry(RouterEntry):
    """A gate model picks top-k expert models per input; their outputs are combined by the gate's weights."""

    kind: Literal["moe"]
    gate: str
    """The served gate model (outputs one logit per expert)."""
    experts: list[str] = Field(min_length=1)
    """Served expert models, in the gate's expert order."""
    top_k: PositiveInt = 2
    """Default experts per input (a request may override it)."""
    combine: Literal["topk", "noisy_topk", "gumbel"] = "topk"
    """The gate family the experts were trained with (how the weights are formed)."""
    capacity: PositiveInt = 8
    """Ongoing requests per expert (per router replica) before it counts as saturated."""
    expert_timeout_s: PositiveFloat = 2.0
    """An expert that has not answered in this time counts as down; its inputs fall back."""
    down_for_s: NonNegativeFloat = 5.0
    """How long a failed expert is skipped before it is tried again."""

    router = "serving.routers.moe:MoERouter"
    trace = (TensorSpec("experts", "INT64", (-1, -1)), TensorSpec("fallback", "BOOL", (-1, -1)))
    parameters = {"top_k": int}

    @model_validator(mode="after")
    def _k(self) -> "MoEEntry":
        if self.top_k > len(self.experts):
            raise ValueError(
                f"moe {self.name!r}: top_k ({self.top_k}) exceeds the number of experts ({len(self.experts)})"
            )
        return self

    def models(self) -> list[str]:
        return [self.gate, *self.experts]

    def check_models(self, served: dict[str, "ModelEntry"]) -> None:
        inside = [name for name in self.models() if served[name].in_ingress]
        if inside:
            raise ValueError(
                f"moe {self.name!r}: {', '.join(inside)} set in_ingress; a router calls its gate and "
                "experts as deployments (each with its own timeout and fallback)"
            )

    def served_shapes(self, shapes: dict[str, Shapes]) -> Shapes:
        """The experts' shapes; the gate maps the same features to one score per expert."""
        input_dim, num_classes = same_shapes(self.describe(), self.experts, shapes)
        gate_in, gate_out = shapes[self.gate]
        if gate_out != len(self.experts) or gate_in != input_dim:
            raise ValueError(
                f"moe {self.name!r}: gate '{self.gate}' maps {gate_in} features to "
                f"{gate_out} scores; it needs {input_dim} features and one score "
                f"per expert ({len(self.experts)})"
            )
        return input_dim, num_classes
