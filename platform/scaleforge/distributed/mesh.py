"""Model parallelism on one device mesh (dims ``dp, fsdp, pp, tp``), from PyTorch's own building blocks.

- tensor parallel: DTensor ``parallelize_module`` with the model family's plan (Megatron layout);
- pipeline parallel: ``torch.distributed.pipelining`` stages cut by the family's plan, micro-batched,
  with the GPipe or 1F1B schedule;
- fully sharded: FSDP2 ``fully_shard`` per plan unit and at the root (HSDP when ``dp > 1``).

Checkpoints hold each rank's own shards in safetensors and JSON, never pickle, and gather nothing
(:mod:`scaleforge.distributed.sharded_checkpoint`); export assembles the whole model in one process.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from scaleforge.distributed.batches import MeshBatches, ordered_data_config
from scaleforge.distributed.dims import ParallelDims
from scaleforge.distributed.memory import MemoryReport, memory_held
from scaleforge.distributed.plan import ParallelPlan
from scaleforge.distributed.sharded_checkpoint import gather_shards, load_shards, save_shards
from scaleforge.distributed.strategy import Batch, LossFn, cross_entropy, scale_gradients

if TYPE_CHECKING:
    from ray.train import DataConfig

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class MeshParallel:
    """This rank's part of a model split by ``dims`` on its mesh. Every method is collective."""

    def __init__(
        self,
        model: nn.Module,
        dims: ParallelDims,
        plan: ParallelPlan,
        device: torch.device,
        bf16: bool = False,
    ):
        self.dims, self.device, self.mesh = dims, device, dims.build_mesh(device.type)
        self.bf16 = bf16
        self._loss: Optional[LossFn] = None
        self._scale = 1.0
        """The loss weight of the slice being trained (gradient accumulation)."""
        model.to(device)
        if dims.tp_enabled:
            parallelize_module(model, self.mesh["tp"], _required(plan.tensor_parallel, "tensor", dims)(model))
        if dims.fsdp_enabled:
            shard_mesh = self.mesh["dp", "fsdp"] if dims.dp > 1 else self.mesh["fsdp"]
            for unit in plan.fsdp_units(model):  # per unit: only one unit is gathered at a time
                fully_shard(unit, mesh=shard_mesh)
            fully_shard(model, mesh=shard_mesh)
        self.schedule, self._target = None, None
        # A parameter of several stages (a tied embedding): its shape, for stages that hold no copy.
        self.tied = {name: model.get_parameter(name).shape for name in plan.tied_parameters(model)}
        if dims.pp_enabled:
            stage = self.mesh.get_local_rank("pp")
            _required(plan.pipeline_stage, "pipeline", dims)(model, stage, dims.pp)
            pipeline = PipelineStage(model, stage, dims.pp, device, group=self.mesh["pp"].get_group())
            self.schedule = _SCHEDULES[dims.pp_schedule](
                pipeline, dims.microbatches, loss_fn=self._stage_loss, scale_grads=False
            )
        self.module = model

    @property
    def data_rank(self) -> int:
        """Which slice of each global batch this rank trains on (tp and pp ranks share a slice)."""
        return self.mesh.get_local_rank("dp") * self.dims.fsdp + self.mesh.get_local_rank("fsdp")

    @property
    def data_world(self) -> int:
        return self.dims.data_world

    @property
    def reports_metrics(self) -> bool:
        """One rank per data slice sees the logits: the last pipeline stage, tensor-parallel rank 0."""
        return self.mesh.get_local_rank("pp") == self.dims.pp - 1 and self.mesh.get_local_rank("tp") == 0

    def batches(
        self,
        batch_size: int,
        seed: int,
        num_train: int,
        columns: dict[str, torch.dtype],
        slices: Optional[int] = None,
    ) -> MeshBatches:
        if extra := set(columns) - {"x", "y"}:
            raise ValueError(
                f"{self.dims.describe()} reads x and y only, not {', '.join(sorted(extra))}; "
                "train with data parallelism"
            )
        return MeshBatches(
            batch_size,
            seed,
            self.data_rank,
            self.data_world,
            columns,
            fixed_shapes=self.schedule is not None,
            slices=slices,
        )

    def train_step(
        self, batch: Batch, loss_fn: LossFn, scale: float = 1.0, sync: bool = True
    ) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """Forward and backward of one batch; gradients end up averaged over the data slices once
        ``sync`` (the step's last slice): until then FSDP skips its reduce-scatter and dp its all-reduce,
        and each rank adds to its own gradients."""
        if self.dims.fsdp_enabled:
            self.module.set_requires_gradient_sync(sync)
        if self.schedule is not None:
            self._loss, self._target, self._scale = loss_fn, (batch.y.shape[1:], batch.y.dtype), scale
            with self._autocast():
                loss, logits = self._pipeline(batch.x, batch.y, train=True)
            self._scale = 1.0
            if sync:
                self._sum_tied_gradients()
        else:
            with self._autocast():
                logits = self.module(batch.x).float()
            loss = loss_fn(logits, batch)
            (loss * scale if scale != 1.0 else loss).backward()
        if sync and self.dims.dp > 1 and not self.dims.fsdp_enabled:  # FSDP (HSDP) reduces over dp itself
            average_gradients(self.module, self.mesh["dp"].get_group(), self.dims.dp)
        return (loss, logits) if self.reports_metrics else (None, None)

    @torch.no_grad()
    def predict(self, x: torch.Tensor, rows: int) -> Optional[torch.Tensor]:
        """A pipeline's shapes are fixed at its first step, so its batches are padded to ``rows``."""
        if self.schedule is None:
            logits = self.module(x)
            return logits if self.reports_metrics else None
        count, (target_shape, target_dtype) = len(x), self._target  # as in training, which came first
        padded = torch.cat([x, x.new_zeros(rows - count, *x.shape[1:])])
        target = torch.zeros(rows, *target_shape, dtype=target_dtype, device=x.device)
        _, logits = self._pipeline(padded, target, train=False)
        return None if logits is None or not self.reports_metrics else logits[:count]

    def prepare_eval(self) -> None:
        """Nothing to do: every rank's shards are the exported weights."""

    def _stage_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """A micro-batch's share of the step's loss: the schedule sums their gradients (it does not
        divide them by the micro-batches itself, which would shrink those of earlier accumulated slices)."""
        loss = (self._loss or cross_entropy)(output.float(), Batch(x=output.new_empty(0), y=target))
        return loss * (self._scale / self.dims.microbatches)

    def _autocast(self) -> torch.autocast:
        """``optim.precision: bf16``: training's matmuls in bf16; the weights, their gradients and
        optimiser state stay fp32, and evaluation scores them in fp32, as the exported model scores."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def _pipeline(self, x: torch.Tensor, y: torch.Tensor, train: bool):
        stage, losses = self.mesh.get_local_rank("pp"), []
        first, last = stage == 0, stage == self.dims.pp - 1
        run = self.schedule.step if train else self.schedule.eval
        logits = run(*((x,) if first else ()), **(dict(target=y, losses=losses) if last else {}))
        mean = torch.stack(losses).sum().detach() / self._scale if last else None
        return mean, (logits.float() if last else None)

    @torch.no_grad()
    def clip_gradients(self, max_norm: float) -> float:
        """The norm of the whole model's gradient: a sharded (DTensor) gradient's own norm is over all
        its shards; a plain one is whole on this rank (replicated over dp and tp); the pipeline's
        stages add theirs, a tied parameter counted on the first stage only."""
        stage = self.mesh.get_local_rank("pp")
        grads, square = [], torch.zeros((), dtype=torch.float64, device=self.device)
        for name, param in self.module.named_parameters():
            if param.grad is None:
                continue
            grads.append(param.grad)
            if name in self.tied and stage > 0:
                continue
            norm = torch.linalg.vector_norm(param.grad)
            square += (norm.full_tensor() if isinstance(norm, DTensor) else norm).double() ** 2
        if self.dims.pp_enabled:
            dist.all_reduce(square, group=self.mesh["pp"].get_group())
        return scale_gradients(grads, square.sqrt(), max_norm)

    @torch.no_grad()
    def _sum_tied_gradients(self) -> None:
        """Sum the gradient of each tied parameter over the pipeline: the stages that hold a copy
        (first and last) then take the same step; the others add zeros."""
        for name, shape in self.tied.items():
            try:
                param = self.module.get_parameter(name)
            except AttributeError:  # this stage holds no copy
                param = None
            grad = (
                param.grad
                if param is not None and param.grad is not None
                else torch.zeros(shape, device=self.device)
            )
            dist.all_reduce(grad, group=self.mesh["pp"].get_group())
            if param is not None:
                param.grad = grad

    def memory(self, optimizer: torch.optim.Optimizer) -> MemoryReport:
        return memory_held(self.module, optimizer)

    def save(self, folder: Path, optimizer: torch.optim.Optimizer) -> bool:
        """Every rank writes the shards it holds (a data-parallel replica nothing, the first rank of each
        pipeline stage its plain tensors too), so the folders of all ranks merged (as Ray Train does
        with reported checkpoints) form the checkpoint, and no rank gathers more than it holds."""
        replica = self.mesh.get_local_rank("dp") > 0
        first = not replica and all(self.mesh.get_local_rank(dim) == 0 for dim in ("fsdp", "tp"))
        return save_shards(
            folder, self.module, optimizer, dist.get_rank(), replica=replica, first_of_stage=first
        )

    def load(self, folder: Path, optimizer: torch.optim.Optimizer) -> None:
        load_shards(folder, self.module, optimizer)

    @staticmethod
    def data_config(ordered: bool = True) -> "DataConfig":
        """Every worker reads the whole dataset in one fixed order, so ranks sharing a slice take the same
        rows."""
        return ordered_data_config()

    @staticmethod
    def gather(folder: Path, model: nn.Module) -> nn.Module:
        """Fill the whole, unsplit ``model`` from a checkpoint's shards, in one process (no process group)."""
        return gather_shards(folder, model)


def _required(part, kind: str, dims: ParallelDims):
    if part is None:
        raise ValueError(f"{dims.describe()}: this model family has no {kind}-parallel plan")
    return part


@torch.no_grad()
def average_gradients(module: nn.Module, group: dist.ProcessGroup, size: int) -> None:
    """Average every gradient (its local shard, for DTensors) over the data-parallel ``group``."""
    for param in module.parameters():
        if param.grad is not None:
            grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            dist.all_reduce(grad, group=group)
            grad /= size
