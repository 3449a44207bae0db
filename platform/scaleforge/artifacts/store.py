"""Model artifacts: ``model.safetensors`` + ``manifest.json``, written atomically, verified on load.

No pickle anywhere: weights are safetensors, everything else is JSON, and the architecture is
rebuilt from the manifest's model spec through the registry.

An artifact lives in a local folder or under a URI (``s3://bucket/artifacts/teacher``, see
:mod:`scaleforge.storage`). A local folder is replaced in one rename. Under a URI there is no
rename: the old manifest goes first, then the weights are uploaded, then the manifest last, so a
prefix without a valid manifest is never taken for an artifact (a writer killed mid-upload leaves
an incomplete one, refused by name). Loading from a URI goes through the node-local cache of
:mod:`scaleforge.artifacts.cache`.
"""

import json
import os
import shutil
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from safetensors.torch import load_file, save_file
from torch import nn

import scaleforge
from scaleforge import storage
from scaleforge.artifacts.cache import cached_weights
from scaleforge.artifacts.layout import FORMAT, MANIFEST, WEIGHTS, ArtifactError, verify
from scaleforge.artifacts.tensors import decode_state, encode_state
from scaleforge.compress.steps import replay_edits
from scaleforge.models import MODEL_SPEC, build_model
from scaleforge.models.surgery import count_weights
from scaleforge.storage import Location, is_uri, sha256_file


@dataclass
class Artifact:
    """A loaded artifact: the rebuilt model (eval mode), its manifest, where it was loaded from (a
    local folder or a URI) and the local weights file that was read (a cache entry for a URI)."""

    model: nn.Module
    manifest: dict[str, Any]
    path: Union[Path, str]
    weights: Path


def save_artifact(
    path: Location,
    model: nn.Module,
    spec: Any,
    *,
    input_dim: int,
    num_classes: int,
    metrics: Optional[dict[str, float]] = None,
    dataset: Optional[dict[str, Any]] = None,
    extra: Optional[dict[str, Any]] = None,
    architecture: Optional[list[dict[str, Any]]] = None,
) -> Union[Path, str]:
    """Export ``model`` as an artifact at ``path``, replacing any previous one.

    Args:
        path: Destination folder, or a URI.
        model: The trained module (unwrapped, not DDP).
        spec: Its registry spec (e.g. ``CNN1dSpec``); the loader rebuilds the architecture from it.
        input_dim: Input features.
        num_classes: Output classes.
        metrics: Evaluation results to record (e.g. ``{"test_accuracy": 0.98}``).
        dataset: Where the training data came from, with its ``fingerprint``.
        extra: Further JSON-serialisable fields for later stages.
        architecture: Edits that turned ``spec``'s model into ``model`` (pruned shapes, low-rank
            factors, quantization; see ``scaleforge.compress.steps``), replayed by the loader.

    Returns:
        The artifact folder (absolute), or the URI as given.
    """
    fields = dict(
        spec=spec,
        input_dim=input_dim,
        num_classes=num_classes,
        metrics=metrics,
        dataset=dataset,
        extra=extra,
        architecture=architecture,
    )
    if is_uri(path):
        storage.resolve(path)  # a scheme this build cannot open fails here, naming the URI
        with tempfile.TemporaryDirectory(prefix="scaleforge-artifact-") as staging:
            _write(Path(staging), model, **fields)
            storage.delete_file(storage.join(path, MANIFEST))  # not an artifact until the new manifest lands
            storage.upload(Path(staging) / WEIGHTS, storage.join(path, WEIGHTS))
            storage.upload(Path(staging) / MANIFEST, storage.join(path, MANIFEST))
        return str(path)
    target = storage.local_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _write(staging, model, **fields)
        _fsync_dir(staging)
        _swap_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _write(
    staging: Path, model: nn.Module, *, spec, input_dim, num_classes, metrics, dataset, extra, architecture
) -> None:
    """``model.safetensors`` then ``manifest.json`` (with the weights' sha256) into ``staging``."""
    tensors, layout = encode_state(model.state_dict())
    save_file(tensors, staging / WEIGHTS)
    compressed = {"architecture": architecture, "state_layout": layout} if architecture else {}
    manifest = {
        "format": FORMAT,
        "model": spec.model_dump(mode="json"),
        "input_dim": input_dim,
        "num_classes": num_classes,
        "parameters": count_weights(model),
        "metrics": metrics or {},
        "dataset": dataset or {},
        "weights": {
            "file": WEIGHTS,
            "sha256": sha256_file(staging / WEIGHTS),
            "bytes": (staging / WEIGHTS).stat().st_size,
        },
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "scaleforge_version": scaleforge.__version__,
        **compressed,
        **(extra or {}),
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def load_artifact(path: Location) -> Artifact:
    """Load and verify an artifact written by :func:`save_artifact`, from a folder or a URI.

    A compressed model is rebuilt exactly: the base architecture from the registry, then the
    manifest's ``architecture`` edits, then its int8/float tensors.

    Raises:
        ArtifactError: the artifact or a file is missing or incomplete, the manifest is malformed,
            or the weights' sha256 differs from the manifest's (a tampered or corrupted file).
        scaleforge.storage.StorageError: a URI whose storage cannot be reached.
    """
    manifest = read_manifest(path)
    if is_uri(path):
        weights = cached_weights(path, manifest)  # verified against the manifest's sha256
        where: Union[Path, str] = str(path)
    else:
        where = storage.local_path(path)
        weights = where / manifest["weights"]["file"]
        if not weights.is_file():
            raise ArtifactError(f"{where}: weights file {weights.name} is missing")
        verify(weights, manifest["weights"]["sha256"], str(weights))
    spec = MODEL_SPEC.validate_python(manifest["model"])
    model = build_model(spec, manifest["input_dim"], manifest["num_classes"])
    model = replay_edits(model, manifest.get("architecture", []), manifest["input_dim"])
    state = OrderedDict(decode_state(load_file(weights), manifest.get("state_layout", {})))
    # Quantized modules read their format version from the state dict's metadata (the rebuilt
    # module tree has the same versions as the one that was saved).
    state._metadata = model.state_dict()._metadata
    model.load_state_dict(state)
    return Artifact(model.eval(), manifest, where, weights)


def load_model(path: Location) -> nn.Module:
    """The model of an artifact, compressed or not, ready for inference (what serving loads)."""
    return load_artifact(path).model


def read_manifest(folder: Location) -> dict[str, Any]:
    """The parsed ``manifest.json`` of an artifact folder or URI (no weights are read).

    Raises:
        ArtifactError: no manifest (an incomplete upload when the weights are there), invalid
            JSON, or an unknown format.
    """
    where = storage.describe(folder)
    manifest_path = storage.join(folder, MANIFEST)
    if not storage.is_file(manifest_path):
        if storage.is_file(storage.join(folder, WEIGHTS)):
            raise ArtifactError(
                f"{where}: incomplete artifact ({WEIGHTS} without {MANIFEST}: its upload did not "
                "finish), refusing to load"
            )
        raise ArtifactError(f"{where}: not a model artifact (no {MANIFEST})")
    try:
        manifest = json.loads(storage.read_text(manifest_path))
    except json.JSONDecodeError as err:
        raise ArtifactError(f"{storage.describe(manifest_path)}: invalid JSON ({err})") from None
    if manifest.get("format") != FORMAT:
        raise ArtifactError(
            f"{storage.describe(manifest_path)}: unknown format {manifest.get('format')!r}, "
            f"expected {FORMAT!r}"
        )
    return manifest


def _fsync_dir(folder: Path) -> None:
    for item in folder.iterdir():
        with open(item, "rb") as handle:
            os.fsync(handle.fileno())


def _swap_into_place(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; an existing ``target`` is moved aside first, then removed."""
    if not target.exists():
        os.replace(staging, target)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
    os.replace(target, retired / "artifact")
    os.replace(staging, target)
    shutil.rmtree(retired, ignore_errors=True)
