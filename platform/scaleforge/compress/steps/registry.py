"""The registered compression steps, and everything that dispatches on a step's kind through them.

The config's tagged union of steps, the pre-flight, the recipe, the sweeps and the artifact loader
all ask this registry; none names a step. Adding a step is its file (a
:class:`~scaleforge.compress.steps.base.CompressionStep` subclass under ``@register_step``) and its
module's name in the import line below, whose order is the order the config's errors list steps.
"""

from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Field

from scaleforge.compress.steps import distill, prune, low_rank, quantize, export  # noqa: F401  # isort: skip
from scaleforge.compress.steps.base import STEPS, CompressionStep, Edit, ModelState

if TYPE_CHECKING:
    from torch import nn

    from scaleforge.data.sources import ArraySplits


def step_union() -> Any:
    """The tagged union of every registered step (a recipe entry), discriminated by ``step``."""
    return Annotated[Union[tuple(STEPS.values())], Field(discriminator="step")]


def step_for_edit(op: str) -> type[CompressionStep]:
    """The step that writes (and replays) the architecture edit ``op``.

    Raises:
        ValueError: no registered step writes ``op``.
    """
    for cls in STEPS.values():
        if op in cls.edits:
            return cls
    raise ValueError(f"unknown architecture edit {op!r}")


def replay_edits(model: "nn.Module", edits: list[Edit], input_dim: int) -> "nn.Module":
    """Replay a manifest's edits, in order, on a freshly built base model (weights come afterwards)."""
    for edit in edits:
        model = step_for_edit(edit["op"]).replay(model, edit, input_dim)
    return model


def apply_step(
    step: CompressionStep, state: ModelState, data: "ArraySplits"
) -> tuple[ModelState, dict[str, Any]]:
    """The model after ``step`` (``state`` is left untouched) and the step's own measurements.

    The same call serves the recipe chain (in the driver) and every sweep point (in a Ray task), so a
    sweep point is exactly the step the recipe would run.
    """
    return step.apply(state.copy(), data)
