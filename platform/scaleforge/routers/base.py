"""What every router kind declares: its config entry, read by config and deployment, and its runtime.

A router is a served name that answers by calling other served models (a cascade, an MoE router).
A kind is one file in this package: its entry (a :class:`RouterEntry` subclass: which models it calls,
which trace outputs and request parameters it has, what shape it serves and where its models would
rather run) and the runtime class that answers (:attr:`RouterEntry.router`, satisfying the
``serving.routers.Router`` protocol). The file imports no torch, Ray or ``serving`` at module level:
building a config stays torch-free, and the runtime's methods import what they run.
"""

from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from scaleforge.config.serve import ModelEntry

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
Shapes = tuple[int, int]
"""(input_dim, num_classes) of a served name."""


class Section(BaseModel):
    """A block of a router entry: unknown keys are refused (as every config section)."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class TensorSpec:
    """An output tensor of a served name, as ``GET /v2/models/{name}`` lists it (-1: any size)."""

    name: str
    datatype: Literal["INT64", "FP32", "BOOL"]
    shape: tuple[int, ...]


class RouterEntry(Section):
    """A router's entry in ``routers:``. A router kind subclasses this with ``kind: Literal["<kind>"]``,
    its fields, and the class variables below, and is registered in :mod:`scaleforge.routers`."""

    kind: str
    """The router kind (one of the registered kinds)."""
    name: str = Field(pattern=NAME_PATTERN)
    """Name in the URL: ``/v2/models/{name}``."""

    router: ClassVar[type]
    """The runtime router class, defined beside the entry: built once per ingress replica as
    ``router(entry, models, info, metrics)`` (the ``serving.routers.Router`` protocol)."""
    trace: ClassVar[tuple[TensorSpec, ...]] = ()
    """Outputs added when a request sets ``parameters.trace``."""
    parameters: ClassVar[dict[str, type]] = {}
    """Request parameters it reads (besides ``trace``), with their types: checked before it runs."""

    @abstractmethod
    def models(self) -> list[str]:
        """The served models it calls (each must be a model entry of the same app); every kind names
        its own, so a kind without it cannot be built."""

    def check_models(self, served: dict[str, "ModelEntry"]) -> None:
        """Refuse model entries this router cannot call (raise ValueError naming them); all by default."""

    def check_manifests(self, manifests: dict[str, dict[str, Any]]) -> None:
        """Refuse models whose artifacts cannot serve this router, from their manifests (raise ValueError
        naming them; read before deployment, no weights loaded); all by default."""

    def served_shapes(self, shapes: dict[str, Shapes]) -> Shapes:
        """The shapes it serves, from its models' (read from their manifests).

        Raises:
            ValueError: its models disagree; by default all must map the same features to the same classes.
        """
        return same_shapes(self.describe(), self.models(), shapes)

    def placement_hints(self) -> dict[str, Literal["cpu", "gpu"]]:
        """Where its models would rather run on a cluster with CPU-only and GPU nodes (none: Ray decides)."""
        return {}

    def describe(self) -> str:
        """``kind 'name'``, how errors name this entry."""
        return f"{self.kind} {self.name!r}"


def same_shapes(owner: str, names: list[str], shapes: dict[str, Shapes]) -> Shapes:
    """The one (input_dim, num_classes) of ``names``; ValueError naming the two that differ."""
    first = shapes[names[0]]
    for name in names:
        if shapes[name] != first:
            raise ValueError(
                f"{owner}: model '{name}' maps {shapes[name][0]} features to {shapes[name][1]} classes, "
                f"'{names[0]}' maps {first[0]} to {first[1]}"
            )
    return first
