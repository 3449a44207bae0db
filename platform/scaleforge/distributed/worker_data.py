"""Where a Ray Train worker's batches come from."""

import math
from typing import Any, Optional

import ray.train
import ray.train.torch
import torch

from scaleforge.config.schema import OptimSpec
from scaleforge.distributed.model_parallel import ModelParallel
from scaleforge.distributed.replicated_data import ReplicatedBatches, data_slice


class WorkerData:
    """This rank's training and test batches: a Ray Data shard, or under model parallelism the
    whole dataset held as tensors and sliced so that ranks sharing a data slice see the same rows."""

    def __init__(self, split: Optional[ModelParallel], optim: OptimSpec, info: dict[str, Any], world: int,
                 distill: bool = False):
        if split and distill:
            raise ValueError("distillation trains data-parallel only; use parallel degrees of 1")
        self.optim, self.split, self.distill = optim, split, distill
        self.train_shard, self.test_shard = ray.train.get_dataset_shard("train"), ray.train.get_dataset_shard("test")
        self.world = split.data_world if split else world
        # A pipeline fixes its shapes at the first step: test batches are padded to the training batch.
        self.eval_batch = optim.batch_size if split and split.schedule else 1024
        if split:
            x, y = _tensors(self.train_shard)
            self.replicated = ReplicatedBatches(x, y, optim.batch_size, self.split.data_rank, self.world, optim.seed)
            self.test = data_slice(*_tensors(self.test_shard), self.split.data_rank, self.world)
            self.steps_per_epoch = len(self.replicated)
        else:
            self.steps_per_epoch = math.ceil((info["num_train"] // world) / optim.batch_size)

    def train_batches(self, epoch: int):
        """``(x, y, teacher logits)`` batches; the teacher's logits only when distilling, else None."""
        if self.split:
            return ((x, y, None) for x, y in self.replicated.epoch(epoch))
        dtypes = {"x": torch.float32, "y": torch.int64, **({"teacher_logits": torch.float32} if self.distill else {})}
        batches = self.train_shard.iter_torch_batches(
            batch_size=self.optim.batch_size, dtypes=dtypes, device=ray.train.torch.get_device(),
            local_shuffle_buffer_size=4096, local_shuffle_seed=self.optim.seed + epoch,
        )
        return ((batch["x"], batch["y"], batch.get("teacher_logits")) for batch in batches)

    def test_batches(self):
        if self.split:
            return zip(self.test[0].split(self.eval_batch), self.test[1].split(self.eval_batch))
        batches = self.test_shard.iter_torch_batches(batch_size=self.eval_batch, device=ray.train.torch.get_device(),
                                                     dtypes={"x": torch.float32, "y": torch.int64})
        return ((batch["x"], batch["y"]) for batch in batches)


def _tensors(shard) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole (unsplit) Ray Data iterator as ``(x, y)`` tensors on this rank's device."""
    batches = list(shard.iter_torch_batches(batch_size=8192, dtypes={"x": torch.float32, "y": torch.int64},
                                            device=ray.train.torch.get_device()))
    return torch.cat([b["x"] for b in batches]), torch.cat([b["y"] for b in batches])
