"""The one place a served model is read from its artifact.

The serving deployments and offline threshold calibration both load models through
:func:`load_servable`, so other artifact kinds (the compression stage's int8 students) plug in
here and every consumer picks them up.
"""

import os
from dataclasses import dataclass

from torch import nn

from scaleforge.artifacts.store import load_artifact, read_manifest


@dataclass(frozen=True)
class Servable:
    """A model ready to run (eval mode), with the shapes requests are validated against, where its
    artifact is (a folder or a URI) and the local weights file read (this node's cache for a URI)."""

    module: nn.Module
    input_dim: int
    num_classes: int
    source: str
    weights: str


def load_servable(artifact: str | os.PathLike) -> Servable:
    """Load and checksum-verify an artifact for inference (no pickle)."""
    loaded = load_artifact(artifact)
    return Servable(
        loaded.model.eval(),
        int(loaded.manifest["input_dim"]),
        int(loaded.manifest["num_classes"]),
        str(loaded.path),
        str(loaded.weights),
    )


def servable_shapes(artifact: str | os.PathLike) -> tuple[int, int]:
    """(input_dim, num_classes) from the manifest alone, without reading the weights."""
    return manifest_shapes(read_manifest(artifact))


def manifest_shapes(manifest: dict) -> tuple[int, int]:
    """(input_dim, num_classes) of a parsed manifest."""
    return int(manifest["input_dim"]), int(manifest["num_classes"])
