"""The router kinds a serve config's ``routers:`` list takes, one registration line each.

Adding a router kind is one file here (its entry, a :class:`RouterEntry` subclass, and its runtime
class, the entry's ``router``; see :mod:`scaleforge.routers.base`) and one line in
:data:`ROUTER_ENTRIES`. The config union, the deployment checks, the trace outputs and the
ingress all read the kinds from here.
"""

from typing import Annotated, Union

from pydantic import Field

from scaleforge.routers.base import NAME_PATTERN, RouterEntry, TensorSpec
from scaleforge.routers.cascade import CascadeEntry, CascadeStageEntry
from scaleforge.routers.early_exit import EarlyExitEntry
from scaleforge.routers.generator import GeneratorEntry
from scaleforge.routers.moe import MoEEntry

ROUTER_ENTRIES: tuple[type[RouterEntry], ...] = (
    CascadeEntry,
    MoEEntry,
    EarlyExitEntry,
    GeneratorEntry,
)
"""Every router kind's entry class."""

RouterEntries = Annotated[Union[ROUTER_ENTRIES], Field(discriminator="kind")]
"""One entry of ``routers:``, of the kind its ``kind`` names (an unknown kind is refused naming the kinds)."""


def router_kinds() -> list[str]:
    """The registered kinds, as ``kind:`` takes them."""
    return [entry.model_fields["kind"].annotation.__args__[0] for entry in ROUTER_ENTRIES]


def request_parameters() -> dict[str, type]:
    """Every request parameter a served name reads, with its type: ``trace`` and the routers' own."""
    types = {"trace": bool}
    for entry in ROUTER_ENTRIES:
        types |= entry.parameters
    return types


__all__ = [
    "CascadeEntry",
    "CascadeStageEntry",
    "EarlyExitEntry",
    "GeneratorEntry",
    "MoEEntry",
    "NAME_PATTERN",
    "request_parameters",
    "ROUTER_ENTRIES",
    "router_kinds",
    "RouterEntries",
    "RouterEntry",
    "TensorSpec",
]
