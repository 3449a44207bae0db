"""The node-local cache of artifacts read from URIs.

Loading ``s3://bucket/artifacts/teacher`` downloads its weights once per node into
``$SCALEFORGE_CACHE/artifacts/<sha256>/model.safetensors`` (default ``~/.cache/scaleforge``), keyed
by the sha256 that the artifact's manifest records, and verifies them there; later loads of any
artifact with the same weights reuse the file after checking it again. Replicas that start together
on one node download once: the first holds a file lock while the others wait for it. A file that
fails its checksum is never kept (a corrupted object in the bucket is refused by name).
"""

import fcntl
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from scaleforge import storage
from scaleforge.artifacts.layout import WEIGHTS, verify


def cache_root() -> Path:
    """This node's artifact cache: ``$SCALEFORGE_CACHE/artifacts`` (``~/.cache/scaleforge/artifacts``)."""
    return storage.node_cache() / "artifacts"


def cached_weights(location: storage.Location, manifest: dict[str, Any]) -> Path:
    """The local, verified copy of the weights of the artifact at ``location`` (a URI).

    Raises:
        scaleforge.artifacts.ArtifactError: the downloaded weights' sha256 is not the manifest's.
    """
    sha256 = manifest["weights"]["sha256"]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / sha256 / WEIGHTS
    with _locked(root / f"{sha256}.lock"):
        if target.is_file():
            if storage.sha256_file(target) == sha256:
                return target
            target.unlink()  # a damaged cache entry: fetch it again
        fd, staging = tempfile.mkstemp(prefix=f".{sha256[:16]}.", suffix=".tmp", dir=root)
        try:
            with os.fdopen(fd, "wb") as handle:
                storage.download(storage.join(location, manifest["weights"]["file"]), handle)
            verify(
                Path(staging), sha256, storage.describe(storage.join(location, manifest["weights"]["file"]))
            )
            target.parent.mkdir(exist_ok=True)
            os.replace(staging, target)
        finally:
            if os.path.exists(staging):
                os.unlink(staging)
    return target


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
