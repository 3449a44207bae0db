"""Throughput every few steps: tokens (or examples) per second, model FLOP/s and MFU on rank 0's console."""

import time
from typing import Optional

import torch

from scaleforge.models import build_model
from scaleforge.train.hooks.base import TrainHook, WorkerContext


class Throughput(TrainHook):
    """A progress line every ``every`` optimiser steps of each epoch, from rank 0's clock.

    Args:
        every: Steps between lines.
        items_per_step: Tokens (or examples) of one global step: every data rank's batch.
        flops_per_item: Training FLOPs per token (forward and backward), for achieved TFLOP/s.
        unit: ``tokens`` or ``samples``.
        peak_tflops: Dense peak of one worker's device (``jobs.hwbench`` measures it); with it, the
            line gives MFU: achieved FLOP/s over the peak of every worker together.
    """

    def __init__(
        self,
        every: int,
        items_per_step: int,
        flops_per_item: float,
        unit: str,
        peak_tflops: Optional[float] = None,
    ):
        self.every, self.items, self.flops, self.unit, self.peak = (
            every,
            items_per_step,
            flops_per_item,
            unit,
            peak_tflops,
        )
        self._since: Optional[tuple[float, int]] = None

    def on_epoch_start(self, ctx: WorkerContext, epoch: int) -> None:
        self._since = None  # evaluation and checkpoints between epochs are not steps

    def on_step(self, ctx: WorkerContext, epoch: int, step: int) -> None:
        if ctx.rank != 0:
            return
        now = time.perf_counter()
        if self._since is None:
            self._since = (now, step)
            return
        began, first = self._since
        if step - first < self.every:
            return
        rate = (step - first) * self.items / (now - began)
        tflops = rate * self.flops / 1e12
        line = f"[train] epoch {epoch + 1} step {step}/{ctx.steps_per_epoch}  {rate:,.0f} {self.unit}/s"
        if self.flops:
            line += f"  {tflops:.3f} model TFLOP/s"
        if self.flops and self.peak:
            line += f"  MFU {tflops / (self.peak * ctx.world):.1%}"
        ctx.progress.send(line)
        self._since = (now, step)


def throughput_hook(cfg, info, slices: int) -> Throughput:
    """The :class:`Throughput` of a job (``run.log_every_steps``, ``run.peak_tflops``) on data of shape
    ``info``, ``slices`` batches of ``optim.batch_size`` rows a step.

    A language model's FLOPs per token are PaLM's (Chowdhery et al. 2022, appendix B): ``6 N`` for the
    matmuls of its ``N`` parameters (the position table aside) plus ``12 L d T`` for attention over
    ``T`` tokens; other models report examples/s only.
    """
    if info.tokens:
        with torch.device("meta"):
            model = build_model(cfg.model, info.input_dim, info.num_classes)
        params = sum(p.numel() for name, p in model.named_parameters() if name != "position")
        spec = cfg.model
        flops = 6 * params + 12 * spec.num_layers * spec.d_model * info.input_dim
        items, unit = cfg.optim.batch_size * slices * info.input_dim, "tokens"
    else:
        flops, items, unit = 0.0, cfg.optim.batch_size * slices, "samples"
    return Throughput(
        cfg.run.log_every_steps, items, flops, unit, cfg.run.peak_tflops if info.tokens else None
    )
