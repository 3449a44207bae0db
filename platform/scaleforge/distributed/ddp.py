"""Data parallelism: every rank holds the whole model; DDP all-reduces the gradients.

Checkpoints hold one copy of the weights and of the optimiser state (rank 0's), in safetensors.
"""

from contextlib import nullcontext
from pathlib import Path
from typing import Optional, Union

import torch
import torch.distributed as dist
from ray.train import DataConfig
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scaleforge.distributed.batches import MeshBatches, ShardBatches, ordered_data_config
from scaleforge.distributed.checkpoint import (
    load_model_weights,
    load_optimizer_state,
    save_model_state,
    save_optimizer_state,
)
from scaleforge.distributed.dims import ParallelDims
from scaleforge.distributed.memory import MemoryReport
from scaleforge.distributed.plan import ParallelPlan
from scaleforge.distributed.strategy import Batch, LossFn


class DataParallel:
    """The replicated model: on this rank's device, in ``DistributedDataParallel`` when there is more
    than one rank (what Ray Train's ``prepare_model`` does, without needing a Ray Train session, so
    a ``torchrun`` process or a test's gloo group trains the same way)."""

    reports_metrics = True

    def __init__(
        self,
        model: nn.Module,
        dims: ParallelDims,
        plan: ParallelPlan,
        device: torch.device,
        bf16: bool = False,
    ):
        self.dims, self.plan, self.device, self.bf16 = dims, plan, device, bf16
        self.data_rank = dist.get_rank() if dist.is_initialized() else 0
        self.data_world = dims.world_size
        self.model = self._wrap(model)
        self.module = getattr(self.model, "module", self.model)

    def _wrap(self, model: nn.Module) -> nn.Module:
        model.to(self.device)
        if self.data_world == 1:
            return model
        return DistributedDataParallel(
            model, device_ids=[self.device.index] if self.device.type == "cuda" else None
        )

    def batches(
        self,
        batch_size: int,
        seed: int,
        num_train: int,
        columns: dict[str, torch.dtype],
        slices: Optional[int] = None,
    ) -> Union[ShardBatches, MeshBatches]:
        """This rank's Ray Data shard or, given ``slices`` (step checkpoints, elastic runs), its slices
        of one seeded order of the whole set."""
        if slices:
            return MeshBatches(
                batch_size, seed, self.data_rank, self.data_world, columns, fixed_shapes=False, slices=slices
            )
        return ShardBatches(batch_size, seed, num_train, self.data_rank, self.data_world, columns)

    def train_step(
        self, batch: Batch, loss_fn: LossFn, scale: float = 1.0, sync: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # DDP all-reduces in backward; an accumulating slice's forward and backward skip it (no_sync).
        local = self.model.no_sync() if not sync and self.model is not self.module else nullcontext()
        with local:
            with torch.autocast(batch.x.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                logits = self.model(batch.x)
                loss = loss_fn(logits.float(), batch)
            (loss * scale if scale != 1.0 else loss).backward()
        return loss, logits

    def clip_gradients(self, max_norm: float) -> float:
        """Every rank holds the same, already averaged gradients: their norm is the model's."""
        return float(torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm))

    def predict(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        """In fp32 under ``bf16`` too: the weights are fp32, and so is the exported model users score."""
        return self.module(x)

    @torch.no_grad()
    def prepare_eval(self) -> None:
        """Rank 0's buffers (BatchNorm statistics) on every rank: they are what gets exported."""
        if dist.is_initialized():
            for buffer in self.module.buffers():
                dist.broadcast(buffer, 0)

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict (collective where the model is sharded)."""
        return self.module.state_dict()

    def save(self, folder: Path, optimizer: torch.optim.Optimizer) -> bool:
        state = self.full_state()  # a collective where the model is sharded: every rank calls it
        if self.data_rank == 0:  # replicated: one copy is enough
            save_model_state(folder, state)
            save_optimizer_state(folder, optimizer)
        return self.data_rank == 0

    def load(self, folder: Path, optimizer: torch.optim.Optimizer) -> None:
        self.module.load_state_dict(load_model_weights(folder))
        load_optimizer_state(folder, optimizer)

    def memory(self, optimizer: torch.optim.Optimizer) -> Optional[MemoryReport]:
        return None

    @staticmethod
    def data_config(ordered: bool) -> DataConfig:
        """Ray Data splits the training set across the workers; every worker reads the whole test set
        and scores its share of it (:class:`~scaleforge.distributed.batches.ShardBatches`). ``ordered``:
        every worker reads both whole, in order (:class:`~scaleforge.distributed.batches.MeshBatches`)."""
        return ordered_data_config() if ordered else DataConfig(datasets_to_split=["train"])

    @staticmethod
    def gather(folder: Path, model: nn.Module) -> nn.Module:
        """Fill the whole, unsplit ``model`` from a checkpoint of this strategy, in one process."""
        model.load_state_dict(load_model_weights(folder))
        return model
