"""The hook protocol and the list of hooks the worker loop calls."""

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from scaleforge.distributed.dims import ParallelDims
from scaleforge.distributed.strategy import Batch, LossFn, ParallelModel, cross_entropy
from scaleforge.progress import ProgressChannel


@dataclass
class WorkerContext:
    """What a hook may read on a worker."""

    rank: int
    world: int
    start_epoch: int
    """First epoch of this attempt (0, or the epoch after the checkpoint it resumed from)."""
    steps_per_epoch: int
    model: ParallelModel
    progress: ProgressChannel
    """Lines for the driver's console."""
    start_step: int = 0
    """Optimiser steps taken before this attempt (0, or the step of the checkpoint it resumed from)."""
    step: int = 0
    """Optimiser steps taken so far (set before every :meth:`TrainHook.on_step`)."""


class TrainHook:
    """Something that rides along a training run. Every method is a no-op until overridden.

    Worker side (every rank calls each method at the same point, so collectives are allowed):
    :meth:`task_loss`, :meth:`on_epoch_start`, :meth:`on_step`, :meth:`epoch_metrics`.
    Driver side: :meth:`check` before Ray starts, :meth:`export` and :meth:`summary` after the run.
    """

    columns: dict[str, torch.dtype] = {}
    """Extra training-set columns this hook reads from :attr:`Batch.extras`."""

    def check(self, dims: ParallelDims) -> None:
        """Raise ``ValueError`` if this hook cannot run with the layout ``dims``."""

    def task_loss(self, logits: torch.Tensor, batch: Batch) -> Optional[torch.Tensor]:
        """A loss that replaces cross-entropy on the labels (``None``: keep it)."""
        return None

    def on_epoch_start(self, ctx: WorkerContext, epoch: int) -> None:
        """Before the first step of ``epoch`` (0-based)."""

    def on_step(self, ctx: WorkerContext, epoch: int, step: int) -> None:
        """Before step ``step`` (0-based, within the epoch)."""

    def epoch_metrics(self, ctx: WorkerContext) -> dict[str, Any]:
        """Metrics to add to the epoch's report, the same on every rank."""
        return {}

    def export(
        self,
        artifact_dir: str,
        model: nn.Module,
        spec: Any,
        *,
        input_dim: int,
        num_classes: int,
        dataset: dict[str, Any],
    ) -> dict[str, Any]:
        """After training, on the driver, before the artifact is written: extra files next to it
        (``artifact_dir``, the trained ``model`` of architecture ``spec``); returns manifest entries."""
        return {}

    def summary(self, metrics: dict[str, Any]) -> list[str]:
        """Lines for the job's summary, from the final metrics."""
        return []


class Hooks:
    """The run's hooks, called in order."""

    def __init__(self, hooks: list[TrainHook]):
        self.hooks = list(hooks)
        replacing = [type(h).__name__ for h in self.hooks if type(h).task_loss is not TrainHook.task_loss]
        if len(replacing) > 1:
            raise ValueError(f"hooks {', '.join(replacing)} each replace the task loss; use one")

    @property
    def columns(self) -> dict[str, torch.dtype]:
        return {name: dtype for hook in self.hooks for name, dtype in hook.columns.items()}

    def loss_fn(self, auxiliary: Callable[[Batch], Any]) -> LossFn:
        """``(logits, batch) -> loss``: a hook's task loss (or cross-entropy) plus ``auxiliary(batch)``,
        the model family's own terms from the last forward (MoE balancing losses, a side exit's
        cross-entropy: :attr:`scaleforge.models.ModelFamily.auxiliary_loss`)."""

        def loss(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
            for hook in self.hooks:
                task = hook.task_loss(logits, batch)
                if task is not None:
                    return task + auxiliary(batch)
            return cross_entropy(logits, batch) + auxiliary(batch)

        return loss

    def on_epoch_start(self, ctx: WorkerContext, epoch: int) -> None:
        for hook in self.hooks:
            hook.on_epoch_start(ctx, epoch)

    def on_step(self, ctx: WorkerContext, epoch: int, step: int) -> None:
        for hook in self.hooks:
            hook.on_step(ctx, epoch, step)

    def epoch_metrics(self, ctx: WorkerContext) -> dict[str, Any]:
        return {key: value for hook in self.hooks for key, value in hook.epoch_metrics(ctx).items()}
