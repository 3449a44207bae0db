"""One strategy per parallelism behind one small protocol: how a rank trains, evaluates and checkpoints.

- :class:`~scaleforge.distributed.ddp.DataParallel`: the model replicated, gradients all-reduced (DDP);
- :class:`~scaleforge.distributed.ep.ExpertParallel`: MoE experts split over ``ep`` ranks, the rest
  replicated;
- :class:`~scaleforge.distributed.mesh.MeshParallel`: the model split on a device mesh (fsdp, tp, pp,
  with dp).

The worker loop only talks to :class:`ParallelModel`; :func:`strategy_for` is the one place that
asks which strategy a layout needs.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from scaleforge.distributed.dims import ParallelDims
from scaleforge.distributed.memory import MemoryReport
from scaleforge.distributed.plan import ParallelPlan


@dataclass
class Batch:
    """One training batch on this rank: features, labels, and the extra columns hooks asked for."""

    x: torch.Tensor
    y: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


LossFn = Callable[[torch.Tensor, Batch], torch.Tensor]
"""``(logits, batch) -> scalar loss``: the task loss the trainer composes (with its hooks)."""


def cross_entropy(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The mean cross-entropy over every label of the batch: one per example (``[batch, classes]``
    logits), or one per token (a language model's ``[batch, tokens, vocab]``)."""
    return F.cross_entropy(logits.flatten(0, -2), batch.y.flatten())


class WorkerBatches(Protocol):
    """Where a rank's batches come from (a Ray Data shard, or rows replicated across a mesh)."""

    steps_per_epoch: int
    eval_rows: int
    """Largest test batch (a pipeline's shapes are fixed by its training batch)."""

    def train(self, epoch: int, start: int = 0) -> Iterator[list[Batch]]:
        """This rank's batches of every step of ``epoch`` from step ``start`` on (only ordered batches
        resume mid-epoch): one, or several whose gradients accumulate into the step."""

    def test(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...


class ParallelModel(Protocol):
    """This rank's part of the model and how it trains. Methods marked collective are called by
    every rank in the same order."""

    module: nn.Module
    """The parameters this rank holds: the whole model, its shards, or one pipeline stage."""
    data_rank: int
    data_world: int
    reports_metrics: bool
    """Whether this rank sees the logits of its data slice (once per slice, so sums count each example
    once)."""

    def batches(
        self,
        batch_size: int,
        seed: int,
        num_train: int,
        columns: dict[str, torch.dtype],
        slices: Optional[int] = None,
    ) -> WorkerBatches:
        """This rank's training and test batches (``columns``: the dataset columns to read and their
        dtypes: ``x``, ``y`` and what the hooks read). ``slices``: ordered batches, every step's rows a
        function of the seed, epoch and step (so a run resumes mid-epoch), each global batch that many
        slices of ``batch_size`` shared out over the data ranks."""

    def train_step(
        self, batch: Batch, loss_fn: LossFn, scale: float = 1.0, sync: bool = True
    ) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """Forward and backward (collective); gradients end up averaged over the data slices.
        Returns ``(loss, logits)``, or ``(None, None)`` on ranks that do not report metrics.
        Gradient accumulation: the loss is multiplied by ``scale`` before backward, and gradients are
        only accumulated locally unless ``sync`` (the step's last slice)."""

    def clip_gradients(self, max_norm: float) -> float:
        """Scale every gradient so that the norm of the whole model's gradient is at most ``max_norm``
        (collective, after ``train_step``); returns that norm before clipping, the same on every rank."""

    def predict(self, x: torch.Tensor, rows: int) -> Optional[torch.Tensor]:
        """Logits (collective), ``None`` on ranks that do not report metrics."""

    def prepare_eval(self) -> None:
        """Make every rank evaluate exactly the weights that get exported (collective)."""

    def save(self, folder: Path, optimizer: torch.optim.Optimizer) -> bool:
        """Write this rank's part of the checkpoint into ``folder`` (collective); whether it wrote files."""

    def load(self, folder: Path, optimizer: torch.optim.Optimizer) -> None:
        """Restore this rank's model and optimiser state from a checkpoint folder (collective)."""

    def memory(self, optimizer: torch.optim.Optimizer) -> Optional[MemoryReport]:
        """Model-state bytes this rank holds, where the strategy splits them (``None``: replicated)."""


def accumulate(
    parallel: ParallelModel, slices: list[Batch], loss_fn: LossFn, global_slices: int
) -> Iterator[tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]:
    """Forward and backward of this rank's ``slices`` of a global batch of ``global_slices`` slices
    (collective): each loss weighted so that the step's gradient is the mean over the whole global
    batch whatever the number of data ranks (an elastic group below its full size), all-reduced once,
    with the last slice. ``(loss, logits)`` of each slice as ``train_step`` returns it, one at a time."""
    scale = parallel.data_world / global_slices
    for index, batch in enumerate(slices):
        yield parallel.train_step(batch, loss_fn, scale, sync=index == len(slices) - 1)


def strategy_for(dims: ParallelDims) -> type:
    """The strategy class that trains ``dims``; it also reads its checkpoints back in one process
    (``gather``) and tells Ray Train how to split the datasets (``data_config``)."""
    if dims.model_split:
        from scaleforge.distributed.mesh import MeshParallel

        return MeshParallel
    if dims.ep_enabled:
        from scaleforge.distributed.ep import ExpertParallel

        return ExpertParallel
    from scaleforge.distributed.ddp import DataParallel

    return DataParallel


def scale_gradients(grads: list[torch.Tensor], total_norm: torch.Tensor, max_norm: float) -> float:
    """Clip ``grads`` in place to a global norm of ``max_norm`` (as ``torch.nn.utils.clip_grad_norm_``
    does, given the norm of every rank's gradients together)."""
    total = float(total_norm)
    coefficient = min(1.0, max_norm / (total + 1e-6))
    if coefficient < 1.0:
        for grad in grads:
            grad.mul_(coefficient)  # a DTensor scales its local shard
    return total


def parallelize(
    model: nn.Module, dims: ParallelDims, plan: ParallelPlan, device: torch.device, bf16: bool = False
) -> ParallelModel:
    """Split ``model`` (identically initialised on every rank) by ``dims`` with its family's ``plan``.

    Args:
        model: The whole model, same seed on every rank.
        dims: A resolved layout whose world size is the process group's.
        plan: The model family's plan (``scaleforge.models.model_family(name).plan``).
        device: This rank's device.
        bf16: Mixed precision: training's forward passes autocast to bf16; fp32 weights and evaluation.
    """
    return strategy_for(dims)(model, dims, plan, device, bf16)
