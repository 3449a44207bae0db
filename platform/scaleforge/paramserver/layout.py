"""A model's parameters as one contiguous float32 vector, split into shards balanced by bytes."""

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class ParamLayout:
    """Names and shapes of a model's parameters in ``named_parameters()`` order."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, model: nn.Module) -> "ParamLayout":
        named = list(model.named_parameters())
        return cls(tuple(n for n, _ in named), tuple(tuple(p.shape) for _, p in named))

    @property
    def sizes(self) -> list[int]:
        return [int(np.prod(shape)) for shape in self.shapes]

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def flatten(self, model: nn.Module, grads: bool = False, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Parameters (or their gradients) concatenated into one float32 vector (written into ``out``
        when given: a worker's shared gradient buffer)."""
        tensors = [
            (p.grad if grads else p).detach().reshape(-1).to(torch.float32) for p in model.parameters()
        ]
        if out is None:
            return torch.cat(tensors).numpy()
        torch.cat(tensors, out=torch.from_numpy(out))
        return out

    def assign(self, model: nn.Module, flat: np.ndarray) -> None:
        """Copy a flat vector into the model's parameters."""
        source = torch.from_numpy(np.ascontiguousarray(flat))
        with torch.no_grad():
            for param, chunk in zip(model.parameters(), source.split(self.sizes)):
                param.copy_(chunk.view_as(param))

    def bind(self, model: nn.Module) -> np.ndarray:
        """Make the model's parameters views of one float32 vector, returned: loading new parameters
        is then a single copy into it (the model's values are kept)."""
        flat = torch.cat([p.detach().reshape(-1).to(torch.float32) for p in model.parameters()])
        for param, chunk in zip(model.parameters(), flat.split(self.sizes)):
            param.data = chunk.view_as(param)
        return flat.numpy()

    def shard_ranges(self, num_shards: int) -> list[tuple[int, int]]:
        """``num_shards`` contiguous [start, stop) ranges of equal size (to within one element)."""
        if not 1 <= num_shards <= self.total:
            raise ValueError(
                f"num_shards ({num_shards}) must be between 1 and the parameter count ({self.total})"
            )
        bounds = np.linspace(0, self.total, num_shards + 1).round().astype(int)
        return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass(frozen=True)
class InitialSlice:
    """A shard's initial parameters, described rather than copied: the model rebuilt from its seed.

    A few bytes as a constructor argument, so Ray need not keep a large array around for the
    day it restarts the shard (``max_restarts``); rebuilding gives the same values every time.
    """

    model: dict
    """The model spec (JSON)."""
    seed: int
    input_dim: int
    num_classes: int
    start: int
    stop: int

    def values(self) -> np.ndarray:
        from scaleforge.models import MODEL_SPEC, build_model

        torch.manual_seed(self.seed)
        model = build_model(MODEL_SPEC.validate_python(self.model), self.input_dim, self.num_classes)
        return ParamLayout.of(model).flatten(model)[self.start : self.stop]
