"""Where a run is inside an epoch, so that a step checkpoint resumes with the next unseen batch.

The trainer state (rank 0's JSON) holds the global step, the steps done of the epoch in progress
(``epoch_step``) and that epoch's running totals summed over every rank (``epoch_progress``), so a
group that comes back smaller or larger (elastic) still reports the epoch an uninterrupted run
would. The batches of every step are a function of (seed, epoch, step)
(:class:`~scaleforge.distributed.batches.MeshBatches`). What differs per rank is its RNG state
(dropout, noisy gates): one safetensors file each in the checkpoint folder.
"""

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file


def _zeros() -> torch.Tensor:
    return torch.zeros(3, dtype=torch.float64)


@dataclass
class EpochProgress:
    """One rank's running totals of the epoch in progress."""

    train: torch.Tensor = field(default_factory=_zeros)
    """[loss sum, correct, labels] of the steps run so far."""
    logged: torch.Tensor = field(default_factory=_zeros)
    """``train`` at the last loss-curve point."""
    seconds: float = 0.0
    """Training time of the epoch before this attempt took it over."""
    lr: float = 0.0
    began: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        """Training time of the epoch so far, across attempts."""
        return self.seconds + time.perf_counter() - self.began

    def summed(self, world: int) -> dict[str, Any]:
        """The totals of every rank, for the trainer state (collective)."""
        both = torch.stack([self.train, self.logged])
        if world > 1:
            dist.all_reduce(both)
        return {
            "train": both[0].tolist(),
            "logged": both[1].tolist(),
            "seconds": self.elapsed(),
            "lr": self.lr,
        }

    @classmethod
    def resumed(cls, state: dict[str, Any], rank: int) -> "EpochProgress":
        """The epoch a checkpoint interrupted: every rank's totals go to rank 0, so they sum once."""
        saved = state.get("epoch_progress")
        if not state.get("epoch_step") or saved is None:
            return cls()
        if rank:
            return cls(seconds=saved["seconds"], lr=saved["lr"])
        train, logged = (torch.tensor(saved[k], dtype=torch.float64) for k in ("train", "logged"))
        return cls(train, logged, saved["seconds"], saved["lr"])


def _file(folder: Path, rank: int) -> Path:
    return Path(folder) / f"rng.rank{rank}.safetensors"


def save_rng(folder: Path, rank: int) -> None:
    """Write this rank's RNG states into the checkpoint ``folder``."""
    tensors = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["cuda"] = torch.cuda.get_rng_state()
    save_file(tensors, _file(folder, rank))


def load_rng(folder: Path, rank: int) -> bool:
    """Restore this rank's RNG states from the checkpoint ``folder``; whether it held them (a rank
    that an elastic group did not have then keeps its seeded state)."""
    path = _file(folder, rank)
    if not path.exists():
        return False
    tensors = load_file(path)
    torch.set_rng_state(tensors["cpu"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["cuda"])
    return True
