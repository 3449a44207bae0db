"""The early-exit router's entry: one network served as a cascade of its own exits (BranchyNet)."""

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from scaleforge.config.models import capabilities_of
from scaleforge.config.routers.base import RouterEntry, Shapes, TensorSpec

if TYPE_CHECKING:
    from scaleforge.config.serve import ModelEntry


class EarlyExitEntry(RouterEntry):
    """A network with several exits (``capabilities.exits > 1``) answering from its side exit when that
    is confident, and running the rest of the network only for the inputs it is not."""

    kind: Literal["early_exit"]
    model: str
    """The served model whose artifact is the network; it runs in the ingress (``in_ingress: true``)."""
    measure: Literal["max_prob", "margin", "entropy"] = "max_prob"
    """Confidence measure at the side exit (see ``scaleforge.routing.confidence``)."""
    threshold: float = Field(ge=0.0)
    """Inputs whose side-exit confidence is below this run the rest of the network (``.inf``: all do;
    ``0``: none do). A request's ``parameters.min_confidence`` overrides it."""

    router = "serving.routers.early_exit:EarlyExitRouter"
    trace = (TensorSpec("exit", "INT64", (-1,)), TensorSpec("confidence", "FP32", (-1,)))
    parameters = {"min_confidence": float}

    def models(self) -> list[str]:
        return [self.model]

    def check_models(self, served: dict[str, "ModelEntry"]) -> None:
        if not served[self.model].in_ingress:
            raise ValueError(
                f"early_exit {self.name!r}: model {self.model!r} needs in_ingress: true (the router "
                "runs the network's exits itself, in the ingress replica)"
            )

    def check_manifests(self, manifests: dict[str, dict[str, Any]]) -> None:
        """The network's family must have a side exit: the manifest's model name, asked for its
        capabilities (no weights read)."""
        family = manifests[self.model]["model"]["name"]
        exits = capabilities_of(family).exits
        if exits < 2:
            raise ValueError(
                f"early_exit {self.name!r}: model {self.model!r} is a {family} network with {exits} "
                "exit; an early-exit router needs a family with at least 2 (capabilities.exits)"
            )

    def served_shapes(self, shapes: dict[str, Shapes]) -> Shapes:
        return shapes[self.model]
