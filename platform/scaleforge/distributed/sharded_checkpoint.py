"""Model-parallel checkpoints without pickle and without a gather: every rank writes its own shards.

``torch.distributed.checkpoint`` writes its ``.metadata`` (and non-tensor state) with pickle, and a
checkpoint read back from shared storage would then be unpickled. Here each rank writes the pieces of
the model and optimiser state it holds (a DTensor's local shard; a plain tensor, on the first rank of
its pipeline stage), so no rank ever holds more than its own training state, whatever the model's size:

- ``rank<r>.safetensors``: model tensors (``model/<fqn>``) and optimiser tensors (``optim/<fqn>/<name>``);
- ``rank<r>.json``, last: each tensor's global shape and the offset of this rank's piece in it, the
  param groups, scalar optimiser state and the tensor file's sha256.

A piece held by several ranks (replicated over dp, or a DTensor's replicated mesh dimension) is written
once. Resuming, a rank reads the piece whose offset and shape are its own when one exists (the same
layout), and otherwise assembles the whole tensor from the pieces and cuts its own (a layout changed,
one tensor at a time); every file it reads is checked against its digest first. Exporting assembles
the whole, unsplit model in one process.
"""

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from scaleforge.storage import sha256_file, write_atomic

FORMAT = "scaleforge-sharded-checkpoint/1"


class CheckpointError(ValueError):
    """A checkpoint is missing a file, fails its checksum, or does not fit the model; names the file."""


def _entries(model_state: dict, optim_state: dict):
    """``(key, tensor or scalar)`` of a state dict pair, keys as the files name them."""
    for fqn, value in model_state.items():
        yield f"model/{fqn}", value
    for fqn, entries in optim_state["state"].items():
        for name, value in entries.items():
            yield f"optim/{fqn}/{name}", value


def _piece(value: torch.Tensor, first_of_stage: bool) -> Optional[tuple[torch.Tensor, list[int]]]:
    """This rank's piece of ``value`` and its offset in the whole tensor, or ``None`` when another rank
    writes the same piece (or it is empty)."""
    if isinstance(value, DTensor):
        coordinate = value.device_mesh.get_coordinate()
        if any(isinstance(p, Replicate) and c for p, c in zip(value.placements, coordinate)):
            return None
        _, offset = compute_local_shape_and_global_offset(value.shape, value.device_mesh, value.placements)
        local = value.to_local()
        return (local, list(offset)) if local.numel() else None
    return (value, [0] * value.dim()) if first_of_stage else None


def save_shards(
    folder: Path,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    rank: int,
    *,
    replica: bool,
    first_of_stage: bool,
) -> bool:
    """Write this rank's pieces of ``module`` and ``optimizer``, the rank's files named by its global
    ``rank``. ``replica``: a data-parallel copy of another rank's state, which writes nothing;
    ``first_of_stage``: the rank that writes its pipeline stage's plain (unsharded) tensors. Every rank
    of the group calls it. Returns whether this rank wrote files."""
    model_state, optim_state = get_state_dict(module, optimizer)
    if replica:
        return False
    tensors, pieces, scalars = {}, {}, {}
    for key, value in _entries(model_state, optim_state):
        if not torch.is_tensor(value):
            scalars[key] = value
        elif (piece := _piece(value, first_of_stage)) is not None:
            tensors[key] = piece[0].detach().cpu().contiguous()
            pieces[key] = {"shape": list(value.shape), "offset": piece[1]}
    if not tensors and not first_of_stage:
        return False
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"rank{rank}.safetensors"
    fd, staging = tempfile.mkstemp(prefix=f".{data.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:  # written from the tensors' own memory (no copy of the state), then renamed into place
        save_file(tensors, staging)
        os.replace(staging, data)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    document = {
        "format": FORMAT,
        "rank": rank,
        "sha256": sha256_file(data),
        "pieces": pieces,
        "param_groups": optim_state["param_groups"],
        "scalars": scalars,
    }
    write_atomic(folder / f"rank{rank}.json", json.dumps(document, indent=1) + "\n")
    return True


class _Checkpoint:
    """The rank files of one checkpoint folder: where each tensor's pieces are, read one at a time."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        manifests = sorted(self.folder.glob("rank*.json"), key=lambda p: int(p.stem[len("rank") :]))
        if not manifests:
            raise CheckpointError(f"{self.folder}: no rank<r>.json (not a sharded checkpoint of this format)")
        self.documents = [_manifest(path) for path in manifests]
        self.pieces: dict[str, list[tuple[Path, dict]]] = {}
        self.digests: dict[Path, str] = {}
        self.verified: set[Path] = set()
        for path, document in zip(manifests, self.documents):
            data = path.with_suffix(".safetensors")
            self.digests[data] = document["sha256"]
            for key, piece in document["pieces"].items():
                self.pieces.setdefault(key, []).append((data, piece))
        self.scalars = {k: v for document in self.documents for k, v in document["scalars"].items()}

    def _verified(self, data: Path) -> Path:
        """``data``, once its sha256 matched its manifest's (checked on first use, once per file)."""
        if data not in self.verified:
            if not data.is_file():
                raise CheckpointError(f"{data}: missing (an incomplete or foreign checkpoint)")
            if sha256_file(data) != self.digests[data]:
                raise CheckpointError(
                    f"{data}: sha256 does not match {data.stem}.json (tampered with or torn); refusing it"
                )
            self.verified.add(data)
        return data

    def _read(self, data: Path, key: str) -> torch.Tensor:
        with safe_open(self._verified(data), framework="pt") as handle:
            return handle.get_tensor(key)

    def whole(self, key: str, shape: torch.Size) -> torch.Tensor:
        """The whole tensor ``key`` from its pieces."""
        if key not in self.pieces:
            raise CheckpointError(f"{self.folder}: holds no {key} (another model or layout)")
        found = self.pieces[key]
        if (saved := tuple(found[0][1]["shape"])) != tuple(shape):
            raise CheckpointError(
                f"{self.folder}: {key} has shape {saved} where the model has {tuple(shape)}"
            )
        whole, covered, seen = None, 0, set()
        for data, piece in found:
            if tuple(piece["offset"]) in seen:
                continue  # a tied parameter's copy on another pipeline stage
            part = self._read(data, key)
            if whole is None:
                whole = part.new_empty(shape) if part.shape != shape else part
            if whole is not part:
                whole[tuple(slice(o, o + n) for o, n in zip(piece["offset"], part.shape))] = part
            seen.add(tuple(piece["offset"]))
            covered += part.numel()
        if covered != whole.numel():
            raise CheckpointError(
                f"{self.folder}: the pieces of {key} cover {covered} of {whole.numel()} elements"
            )
        return whole

    def like(self, key: str, like: torch.Tensor) -> torch.Tensor:
        """``key`` as ``like`` is held on this rank: its own piece when one was written, else cut from
        the whole tensor (computed locally, no communication)."""
        if isinstance(like, DTensor):
            shape, offset = compute_local_shape_and_global_offset(
                like.shape, like.device_mesh, like.placements
            )
            for data, piece in self.pieces.get(key, []):
                if list(piece["offset"]) == list(offset) and list(piece["shape"]) == list(like.shape):
                    part = self._read(data, key)
                    if tuple(part.shape) == tuple(shape):
                        return DTensor.from_local(
                            part.to(like.dtype),
                            like.device_mesh,
                            like.placements,
                            run_check=False,
                            shape=like.shape,
                            stride=like.stride(),
                        )
            whole = self.whole(key, like.shape).to(device=like.device, dtype=like.dtype)
            return distribute_tensor(whole, like.device_mesh, like.placements, src_data_rank=None)
        return self.whole(key, like.shape).to(device=like.device, dtype=like.dtype)


def _manifest(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except ValueError as err:
        raise CheckpointError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: format {document.get('format') if isinstance(document, dict) else None!r}, "
            f"expected {FORMAT!r}"
        )
    return document


def load_shards(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Restore this rank's shards of the model and optimiser from the checkpoint in ``folder``."""
    checkpoint = _Checkpoint(folder)
    model_state, optim_state = get_state_dict(module, optimizer)  # this rank's shards: the layout to fill
    for fqn, like in model_state.items():
        model_state[fqn] = checkpoint.like(f"model/{fqn}", like)
    for fqn, entries in optim_state["state"].items():
        for name, like in entries.items():
            key = f"optim/{fqn}/{name}"
            if torch.is_tensor(like):
                entries[name] = checkpoint.like(key, like)
            elif key in checkpoint.scalars:
                entries[name] = checkpoint.scalars[key]
    saved = checkpoint.documents[0]["param_groups"]
    if len(saved) != len(optim_state["param_groups"]):
        raise CheckpointError(
            f"{folder}: {len(saved)} optimiser param groups where the job has "
            f"{len(optim_state['param_groups'])}"
        )
    optim_state["param_groups"] = [  # the saved hyperparameters over this rank's own parameters
        {**{k: tuple(v) if k == "betas" else v for k, v in group.items()}, "params": mine["params"]}
        for group, mine in zip(saved, optim_state["param_groups"])
    ]
    set_state_dict(module, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)


def gather_shards(folder: Path, model: nn.Module) -> nn.Module:
    """Fill the whole, unsplit ``model`` from every rank's files, in one process, a tensor at a time."""
    checkpoint = _Checkpoint(folder)
    with torch.no_grad():
        for fqn, tensor in model.state_dict().items():
            tensor.copy_(checkpoint.whole(f"model/{fqn}", tensor.shape))
    return model
