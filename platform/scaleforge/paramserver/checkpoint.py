"""A shard's checkpoint: its slice, its optimiser's tensors and its counters in one safetensors file,
replaced atomically, local or in a bucket."""

import json
from dataclasses import dataclass

import torch
from safetensors.torch import load, save

from scaleforge.storage import is_file, read_bytes, write_atomic


@dataclass
class ShardState:
    """What a restarted shard needs to go on where its checkpoint left off."""

    param: torch.Tensor
    optimizer: dict[str, torch.Tensor]
    """The optimiser's state of the slice (:class:`~scaleforge.paramserver.update.SliceOptimizer`'s, named
    as ``torch.optim``'s classes name it)."""
    version: int
    clocks: dict[int, int]
    """Steps received from each active worker."""


def save_checkpoint(path: str, state: ShardState) -> None:
    """Write ``state`` to ``path`` (a local file or an object in a bucket), replacing it atomically."""
    tensors = {"param": state.param.detach().clone()}
    for name, value in state.optimizer.items():
        tensors[f"opt.{name}"] = value.detach().clone() if torch.is_tensor(value) else torch.tensor(value)
    metadata = {
        "version": str(state.version),
        "clocks": ",".join(f"{w}:{c}" for w, c in state.clocks.items()),
    }
    write_atomic(path, save(tensors, metadata=metadata))


def load_checkpoint(path: str) -> "ShardState | None":
    """The state saved at ``path``; ``None`` if there is no checkpoint yet."""
    if not is_file(path):
        return None
    blob = read_bytes(path)  # a local file or an object in the bucket
    metadata = _safetensors_metadata(blob)
    tensors = load(blob)
    clocks = metadata["clocks"]
    return ShardState(
        param=tensors.pop("param"),
        optimizer={k.removeprefix("opt."): v for k, v in tensors.items()},
        version=int(metadata["version"]),
        clocks={int(w): int(c) for w, c in (item.split(":") for item in clocks.split(",") if item)},
    )


def _safetensors_metadata(blob: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file held in memory: its JSON header, after the header's
    8-byte little-endian length (``safe_open`` reads metadata from a local file only)."""
    size = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + size]).get("__metadata__", {})
