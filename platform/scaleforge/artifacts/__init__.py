"""Model artifacts: safetensors weights + JSON manifest, atomic writes, checksum-verified loads."""

from scaleforge.artifacts.store import (
    Artifact,
    ArtifactError,
    load_artifact,
    load_model,
    read_manifest,
    save_artifact,
)

__all__ = ["Artifact", "ArtifactError", "load_artifact", "load_model", "read_manifest", "save_artifact"]
