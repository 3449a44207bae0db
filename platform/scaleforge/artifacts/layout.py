"""What an artifact is made of, shared by the store and the node-local cache."""

FORMAT = "scaleforge.artifact/1"
WEIGHTS = "model.safetensors"
MANIFEST = "manifest.json"


class ArtifactError(RuntimeError):
    """An artifact is missing, incomplete, malformed, or fails its checksum."""
