"""Model-parallel checkpoints without pickle: per pipeline stage, full tensors in safetensors, the rest JSON.

``torch.distributed.checkpoint`` writes its ``.metadata`` (and non-tensor state) with pickle, and a
checkpoint read back from shared storage would then be unpickled. Here every rank of a stage takes
part in gathering the stage's full state (``get_state_dict(..., full_state_dict=True)``, a
collective), and one rank per pipeline stage writes:

- ``stage<p>.safetensors``: model tensors (``model/<fqn>``) and optimiser tensors (``optim/<fqn>/<name>``);
- ``stage<p>.json``, last: param groups, scalar optimiser state and the tensor file's sha256.

Resuming, every rank reads its stage's files, verifies the digest, cuts its own shard out of each
full tensor (``distribute_tensor`` without communication) and loads them with ``set_state_dict``;
exporting merges the stages' model tensors into one state dict. Full tensors per stage cost a gather
on save; the models trained this way fit one host's memory per stage, which is what the gather needs.
"""

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from scaleforge.storage import write_atomic

FORMAT = "scaleforge-stage-checkpoint/1"
_FULL = StateDictOptions(full_state_dict=True)


class CheckpointError(ValueError):
    """A checkpoint is missing a file, fails its checksum, or does not fit the model; names the file."""


def save_stage(
    folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer, stage: int, writer: bool
) -> bool:
    """Collective over the ranks of the mesh: gather this stage's full state; ``writer`` writes it.
    Returns whether this rank wrote files."""
    model_state, optim_state = get_state_dict(module, optimizer, options=_FULL)
    if not writer:
        return False
    tensors = {f"model/{key}": value for key, value in model_state.items()}
    scalars: dict[str, dict[str, Any]] = {}
    for fqn, entries in optim_state["state"].items():
        for name, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"optim/{fqn}/{name}"] = value
            else:
                scalars.setdefault(fqn, {})[name] = value
    blob = save_tensors({key: value.detach().cpu().contiguous() for key, value in tensors.items()})
    folder = Path(folder)
    write_atomic(folder / f"stage{stage}.safetensors", blob)
    document = {
        "format": FORMAT,
        "stage": stage,
        "sha256": hashlib.sha256(blob).hexdigest(),
        "param_groups": optim_state["param_groups"],
        "scalars": scalars,
    }
    write_atomic(folder / f"stage{stage}.json", json.dumps(document, indent=1) + "\n")
    return True


def load_stage(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer, stage: int) -> None:
    """Restore this rank's shards of the model and optimiser from stage ``stage``'s files."""
    document, tensors = _read(Path(folder), stage)
    model_state, optim_state = get_state_dict(module, optimizer)  # this rank's shards: the layout to fill
    try:
        for fqn, like in model_state.items():
            model_state[fqn] = _shard_like(tensors[f"model/{fqn}"], like)
        for fqn, entries in optim_state["state"].items():
            for name, like in entries.items():
                entries[name] = (
                    _shard_like(tensors[f"optim/{fqn}/{name}"], like)
                    if torch.is_tensor(like)
                    else document["scalars"][fqn][name]
                )
    except KeyError as err:
        raise CheckpointError(
            f"{folder}/stage{stage}.safetensors: holds no {err.args[0]} (another model or layout)"
        ) from None
    optim_state["param_groups"] = [
        {k: tuple(v) if k == "betas" else v for k, v in group.items()} for group in document["param_groups"]
    ]
    set_state_dict(module, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)


def _shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` cut the way ``like`` is sharded on this rank, computed locally (every rank has ``full``)."""
    if full.shape != like.shape:
        raise CheckpointError(
            f"a tensor of shape {tuple(full.shape)} where the model has {tuple(like.shape)}"
        )
    full = full.to(device=like.device, dtype=like.dtype)
    if isinstance(like, DTensor):
        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
    return full


def gather_stages(folder: Path, model: nn.Module) -> nn.Module:
    """Fill the whole, unsplit ``model`` from every stage's files, in one process."""
    folder = Path(folder)
    stages = sorted(int(path.stem[len("stage") :]) for path in folder.glob("stage*.json"))
    if not stages:
        raise CheckpointError(f"{folder}: no stage<p>.json (not a model-parallel checkpoint of this format)")
    merged: dict[str, torch.Tensor] = {}
    for stage in stages:
        _, tensors = _read(folder, stage)
        merged |= {key[len("model/") :]: value for key, value in tensors.items() if key.startswith("model/")}
    missing = sorted(set(model.state_dict()) - set(merged))
    if missing:
        raise CheckpointError(f"{folder}: stages {stages} hold no {', '.join(missing[:5])}")
    model.load_state_dict(merged)
    return model


def _read(folder: Path, stage: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The stage's JSON and tensors, after checking the format and the tensor file's sha256."""
    manifest, data = folder / f"stage{stage}.json", folder / f"stage{stage}.safetensors"
    for path in (manifest, data):
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (an incomplete or foreign checkpoint)")
    try:
        document = json.loads(manifest.read_text())
    except ValueError as err:
        raise CheckpointError(f"{manifest}: not valid JSON ({err})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CheckpointError(
            f"{manifest}: format {document.get('format') if isinstance(document, dict) else None!r}, "
            f"expected {FORMAT!r}"
        )
    blob = data.read_bytes()
    if hashlib.sha256(blob).hexdigest() != document["sha256"]:
        raise CheckpointError(
            f"{data}: sha256 does not match {manifest.name} (tampered with or torn); refusing it"
        )
    return document, load_tensors(blob)
