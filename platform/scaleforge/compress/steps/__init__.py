"""Compression steps, one file each (its config entry, pre-flight check, apply and replay), and
their registry; see :mod:`scaleforge.compress.steps.base` for what a step is.

The job schemas (``scaleforge.config``) build the recipe's union from the registry, and the step
files import schema modules, so ``scaleforge.config`` is imported first: whichever of the two a
program imports first, the registry is then complete before the schema that reads it.
"""

import scaleforge.config  # noqa: F401  # isort: skip (before the registry: see above)
from scaleforge.compress.steps.base import (
    STEPS,
    CompressionStep,
    FinetuneSpec,
    ModelState,
    Skeleton,
    StepArtifact,
    StepOutcome,
    register_step,
)
from scaleforge.compress.steps.registry import apply_step, replay_edits, step_for_edit, step_union

__all__ = [
    "apply_step",
    "CompressionStep",
    "FinetuneSpec",
    "ModelState",
    "register_step",
    "replay_edits",
    "Skeleton",
    "step_for_edit",
    "step_union",
    "StepArtifact",
    "StepOutcome",
    "STEPS",
]
