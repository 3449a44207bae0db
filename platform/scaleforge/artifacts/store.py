"""Model artifacts: ``model.safetensors`` + ``manifest.json``, written atomically, verified on load.

No pickle anywhere: weights are safetensors, everything else is JSON, and the architecture is
rebuilt from the manifest's model spec through the registry.
"""

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from safetensors.torch import load_file, save_file
from torch import nn

import scaleforge
from scaleforge.artifacts.tensors import decode_state, encode_state
from scaleforge.models import MODEL_SPEC, build_model
from scaleforge.models.surgery import apply_edits, count_weights

FORMAT = "scaleforge.artifact/1"
WEIGHTS = "model.safetensors"
MANIFEST = "manifest.json"


class ArtifactError(RuntimeError):
    """An artifact folder is missing, malformed, or fails its checksum."""


@dataclass
class Artifact:
    """A loaded artifact: the rebuilt model (eval mode) and its manifest."""

    model: nn.Module
    manifest: dict[str, Any]
    path: Path


def save_artifact(
    path: str | os.PathLike,
    model: nn.Module,
    spec: Any,
    *,
    input_dim: int,
    num_classes: int,
    metrics: Optional[dict[str, float]] = None,
    dataset: Optional[dict[str, Any]] = None,
    extra: Optional[dict[str, Any]] = None,
    architecture: Optional[list[dict[str, Any]]] = None,
) -> Path:
    """Export ``model`` as an artifact folder at ``path``, replacing any previous one atomically.

    Args:
        path: Destination folder.
        model: The trained module (unwrapped, not DDP).
        spec: Its registry spec (e.g. ``CNN1dSpec``); the loader rebuilds the architecture from it.
        input_dim: Input features.
        num_classes: Output classes.
        metrics: Evaluation results to record (e.g. ``{"test_accuracy": 0.98}``).
        dataset: Where the training data came from, with its ``fingerprint``.
        extra: Further JSON-serialisable fields for later stages.
        architecture: Edits that turned ``spec``'s model into ``model`` (pruned shapes, low-rank
            factors, quantization; see ``scaleforge.models.surgery``), replayed by the loader.

    Returns:
        The artifact folder.
    """
    target = Path(path).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
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
            "weights": {"file": WEIGHTS, "sha256": _sha256(staging / WEIGHTS), "bytes": (staging / WEIGHTS).stat().st_size},
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "scaleforge_version": scaleforge.__version__,
            **compressed,
            **(extra or {}),
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        _fsync_dir(staging)
        _swap_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def load_artifact(path: str | os.PathLike) -> Artifact:
    """Load and verify an artifact folder written by :func:`save_artifact`.

    A compressed model is rebuilt exactly: the base architecture from the registry, then the
    manifest's ``architecture`` edits, then its int8/float tensors.

    Raises:
        ArtifactError: the folder or a file is missing, the manifest is malformed, or the
            weights' sha256 differs from the manifest's (a tampered or corrupted file).
    """
    folder = Path(path).expanduser().resolve()
    manifest = read_manifest(folder)
    weights = folder / manifest["weights"]["file"]
    if not weights.is_file():
        raise ArtifactError(f"{folder}: weights file {weights.name} is missing")
    actual = _sha256(weights)
    if actual != manifest["weights"]["sha256"]:
        raise ArtifactError(
            f"{weights}: checksum mismatch (manifest sha256 {manifest['weights']['sha256'][:12]}..., "
            f"file sha256 {actual[:12]}...); the weights were modified or corrupted, refusing to load"
        )
    spec = MODEL_SPEC.validate_python(manifest["model"])
    model = build_model(spec, manifest["input_dim"], manifest["num_classes"])
    model = apply_edits(model, manifest.get("architecture", []), manifest["input_dim"])
    state = OrderedDict(decode_state(load_file(weights), manifest.get("state_layout", {})))
    # Quantized modules read their format version from the state dict's metadata (the rebuilt
    # module tree has the same versions as the one that was saved).
    state._metadata = model.state_dict()._metadata
    model.load_state_dict(state)
    return Artifact(model.eval(), manifest, folder)


def load_model(path: str | os.PathLike) -> nn.Module:
    """The model of an artifact, compressed or not, ready for inference (what serving loads)."""
    return load_artifact(path).model


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """The parsed ``manifest.json`` of an artifact folder (no weights are read)."""
    manifest_path = Path(folder) / MANIFEST
    if not manifest_path.is_file():
        raise ArtifactError(f"{folder}: not a model artifact (no {MANIFEST})")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as err:
        raise ArtifactError(f"{manifest_path}: invalid JSON ({err})") from None
    if manifest.get("format") != FORMAT:
        raise ArtifactError(f"{manifest_path}: unknown format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
