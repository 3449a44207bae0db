"""Model parallelism inside Ray Train workers, from PyTorch's own building blocks.

- tensor parallel: DTensor ``parallelize_module``; each encoder layer's query/key/value and first
  feed-forward projections split column-wise (attention heads across ranks), the attention
  output and second feed-forward projection row-wise (Megatron layout: one all-reduce each);
- pipeline parallel: ``torch.distributed.pipelining`` stages of consecutive layers, micro-batched,
  with the GPipe or 1F1B schedule;
- fully sharded: FSDP2 ``fully_shard`` per layer and at the root (HSDP when ``dp > 1``);
- one ``DeviceMesh`` (dims ``dp, fsdp, pp, tp``) composes them with data parallelism.

Tensor and pipeline parallelism need a model with a ``layers`` ``ModuleDict`` and ``embed`` /
``head`` ends (:class:`~scaleforge.models.transformer.TransformerClassifier`); FSDP works on any
dense model. Checkpoints stay sharded (``torch.distributed.checkpoint``) and are gathered into one
full state dict in one process for export.
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from scaleforge.config.schema import ParallelSpec
from scaleforge.distributed.memory import MemoryReport, memory_held

MESH_DIMS = ("dp", "fsdp", "pp", "tp")
_COLUMNWISE = ("attention.query", "attention.key", "attention.value", "ff_in")
_ROWWISE = ("attention.out", "ff_out")
_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def build_mesh(parallel: ParallelSpec, device_type: str) -> DeviceMesh:
    """The ``dp x fsdp x pp x tp`` mesh over every rank (tp innermost: its ranks are neighbours)."""
    shape = tuple(getattr(parallel, name) for name in MESH_DIMS)
    if math.prod(shape) != dist.get_world_size():
        raise ValueError(f"parallel layout {dict(zip(MESH_DIMS, shape))} needs {math.prod(shape)} ranks, "
                         f"the process group has {dist.get_world_size()}")
    return init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)


@dataclass
class ModelParallel:
    """This rank's part of a model split by ``parallel`` on ``mesh``: how it trains, predicts and
    checkpoints. Every rank of the mesh calls each method in the same order (they are collective)."""

    parallel: ParallelSpec
    mesh: DeviceMesh
    module: nn.Module
    """The part this rank holds: the whole model with DTensor/FSDP parameters, or a pipeline stage."""
    schedule: Optional[object] = None
    """The pipeline schedule when ``pp > 1``."""

    @property
    def data_rank(self) -> int:
        """Which slice of each global batch this rank trains on (tp and pp ranks share a slice)."""
        return self.mesh.get_local_rank("dp") * self.parallel.fsdp + self.mesh.get_local_rank("fsdp")

    @property
    def data_world(self) -> int:
        """Number of different batch slices per step: ``dp * fsdp``."""
        return self.parallel.dp * self.parallel.fsdp

    @property
    def reports_metrics(self) -> bool:
        """One rank per data slice sees the logits: the last pipeline stage, tensor-parallel rank 0."""
        return self.mesh.get_local_rank("pp") == self.parallel.pp - 1 and self.mesh.get_local_rank("tp") == 0

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """Forward and backward of one batch; gradients end up averaged over the data slices.

        Returns:
            (mean loss, logits) on the rank that reports for this data slice (:attr:`reports_metrics`),
            ``(None, None)`` on the others, so that metrics summed over ranks count each example once.
        """
        if self.schedule is not None:
            loss, logits = self._pipeline(x, y, train=True)
        else:
            logits = self.module(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
        if self.parallel.dp > 1 and self.parallel.fsdp == 1:  # FSDP (HSDP) reduces over dp itself
            average_gradients(self.module, self.mesh["dp"].get_group(), self.parallel.dp)
        return (loss, logits) if self.reports_metrics else (None, None)

    @torch.no_grad()
    def predict(self, x: torch.Tensor, rows: int) -> Optional[torch.Tensor]:
        """Logits for ``x`` on the rank that reports for this data slice, ``None`` on the others.
        A pipeline's shapes are fixed at its first step, so its batches are padded to ``rows``."""
        if self.schedule is None:
            logits = self.module(x)
            return logits if self.reports_metrics else None
        count = len(x)
        padded = torch.cat([x, x.new_zeros(rows - count, *x.shape[1:])])
        _, logits = self._pipeline(padded, torch.zeros(rows, dtype=torch.int64, device=x.device), train=False)
        return None if logits is None or not self.reports_metrics else logits[:count]

    def _pipeline(self, x: torch.Tensor, y: torch.Tensor, train: bool):
        stage, losses = self.mesh.get_local_rank("pp"), []
        first, last = stage == 0, stage == self.parallel.pp - 1
        run = self.schedule.step if train else self.schedule.eval
        logits = run(*((x,) if first else ()), **(dict(target=y, losses=losses) if last else {}))
        return (torch.stack(losses).mean().detach() if last else None), (logits if last else None)

    def memory(self, optimizer: torch.optim.Optimizer) -> MemoryReport:
        """Parameter, gradient and optimiser bytes this rank holds."""
        return memory_held(self.module, optimizer)

    def save(self, folder: Path, optimizer: torch.optim.Optimizer) -> None:
        """Write this rank's shards of the model and optimiser into ``folder`` (DCP; collective).

        Each rank writes its own ``__<rank>_*.distcp`` files and rank 0 the ``.metadata``, so the
        folders of all ranks merged (as Ray Train does with reported checkpoints) form the checkpoint.
        """
        dcp.save(self._state(optimizer), checkpoint_id=str(folder))

    def load(self, folder: Path, optimizer: torch.optim.Optimizer) -> None:
        """Restore model and optimiser shards from a checkpoint written by :meth:`save` (collective)."""
        state = self._state(optimizer)
        dcp.load(state, checkpoint_id=str(folder))
        set_state_dict(self.module, optimizer, model_state_dict=state["model"], optim_state_dict=state[self._optimizer_key])

    def _state(self, optimizer: torch.optim.Optimizer) -> dict:
        model_state, optimizer_state = get_state_dict(self.module, optimizer)
        return {"model": model_state, self._optimizer_key: optimizer_state}

    @property
    def _optimizer_key(self) -> str:
        # Pipeline stages hold different parameters: their param_groups must not overwrite each other.
        return f"optimizer.stage{self.mesh.get_local_rank('pp')}"


def parallelize(model: nn.Module, parallel: ParallelSpec, device: torch.device) -> ModelParallel:
    """Split ``model`` (identically initialised on every rank) by ``parallel`` over all ranks.

    Args:
        model: The whole model, same seed on every rank.
        parallel: A validated layout; its degrees multiply to the world size.
        device: This rank's device.

    Returns:
        This rank's :class:`ModelParallel`.
    """
    mesh = build_mesh(parallel, device.type)
    model.to(device)
    if parallel.tp > 1:
        parallelize_module(model, mesh["tp"], tensor_parallel_plan(model))
    if parallel.fsdp > 1:
        shard_mesh = mesh["dp", "fsdp"] if parallel.dp > 1 else mesh["fsdp"]
        for layer in getattr(model, "layers", {}).values():  # per layer: only one layer is gathered at a time
            fully_shard(layer, mesh=shard_mesh)
        fully_shard(model, mesh=shard_mesh)
    schedule = None
    if parallel.pp > 1:
        stage = mesh.get_local_rank("pp")
        keep_stage(model, stage, parallel.pp)
        pipeline = PipelineStage(model, stage, parallel.pp, device, group=mesh["pp"].get_group())
        schedule = _SCHEDULES[parallel.pp_schedule](pipeline, parallel.microbatches, loss_fn=F.cross_entropy)
    return ModelParallel(parallel, mesh, model, schedule)


def tensor_parallel_plan(model: nn.Module) -> dict:
    """Megatron layout for every encoder layer: column-wise in, row-wise out; the rest replicated."""
    plan = {}
    for name in model.layers:
        plan.update({f"layers.{name}.{linear}": ColwiseParallel() for linear in _COLUMNWISE})
        plan.update({f"layers.{name}.{linear}": RowwiseParallel() for linear in _ROWWISE})
    return plan


def stage_layers(num_layers: int, stages: int) -> list[range]:
    """Consecutive layers per pipeline stage, as even as possible (earlier stages get the extra)."""
    bounds = [round(i * num_layers / stages) for i in range(stages + 1)]
    return [range(bounds[i], bounds[i + 1]) for i in range(stages)]


def keep_stage(model: nn.Module, stage: int, stages: int) -> nn.Module:
    """Reduce ``model`` in place to pipeline stage ``stage`` of ``stages``.

    The stage keeps its layers under their original names (so checkpoints of all stages together
    form the full state dict); the first stage keeps the embedding, the last the norm and head.
    """
    kept = stage_layers(len(model.layers), stages)[stage]
    for name in list(model.layers):
        if int(name) not in kept:
            del model.layers[name]
    if stage > 0:
        model.embed, model.position = None, None
    if stage < stages - 1:
        model.norm, model.head = None, None
    return model


@torch.no_grad()
def average_gradients(module: nn.Module, group: dist.ProcessGroup, size: int) -> None:
    """Average every gradient (its local shard, for DTensors) over the data-parallel ``group``."""
    for param in module.parameters():
        if param.grad is not None:
            grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            dist.all_reduce(grad, group=group)
            grad /= size


def load_gathered_weights(folder: Path, model: nn.Module) -> nn.Module:
    """Fill the whole, unsplit ``model`` from a sharded checkpoint, in one process (no process group).

    DCP reassembles each tensor from the shards of every rank and stage that wrote it.
    """
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    model.load_state_dict(state["model"])
    return model
