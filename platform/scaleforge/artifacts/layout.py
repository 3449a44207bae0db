"""What an artifact is made of, shared by the store and the node-local cache."""

from pathlib import Path

from scaleforge.storage import sha256_file

FORMAT = "scaleforge.artifact/1"
WEIGHTS = "model.safetensors"
MANIFEST = "manifest.json"


class ArtifactError(RuntimeError):
    """An artifact is missing, incomplete, malformed, or fails its checksum."""


def verify(weights: Path, sha256: str, where: str) -> None:
    """Refuse weights whose sha256 is not the manifest's; ``where`` names them in the message."""
    actual = sha256_file(weights)
    if actual != sha256:
        raise ArtifactError(
            f"{where}: checksum mismatch (manifest sha256 {sha256[:12]}..., file sha256 {actual[:12]}...); "
            "the weights were modified or corrupted, refusing to load"
        )
