"""Optimiser and learning-rate schedule of a training run (Goyal et al. 2017, "Accurate, Large
Minibatch SGD")."""

import math

import torch
from torch import nn


def make_optimizer(module: nn.Module, optim) -> torch.optim.Optimizer:
    """AdamW, or SGD with Nesterov momentum, over ``module``'s parameters (``optim``: an ``OptimSpec``);
    with ``optim.decay_norms_and_biases`` off, one-dimensional parameters form a group without decay."""
    params = list(module.parameters())
    if optim.decay_norms_and_biases:
        groups = [{"params": params}]
    else:
        groups = [
            {"params": [p for p in params if p.dim() >= 2]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
    if optim.optimizer == "sgd":
        return torch.optim.SGD(
            groups, lr=optim.lr, momentum=optim.momentum, nesterov=True, weight_decay=optim.weight_decay
        )
    return torch.optim.AdamW(groups, lr=optim.lr, weight_decay=optim.weight_decay)


def peak_learning_rate(lr: float, global_batch: int, base_batch: int, scaling: str) -> float:
    """The linear scaling rule: multiply ``lr`` by ``global_batch / base_batch`` when
    ``scaling == "linear"``."""
    return lr * global_batch / base_batch if scaling == "linear" else lr


def learning_rate_at(step: int, *, peak: float, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Learning rate for optimiser ``step`` (0-based).

    Linear warm-up from ``peak / warmup_steps`` to ``peak`` (gradual warm-up avoids the early
    instability of a large scaled lr), then cosine decay to zero or a constant ``peak``.
    """
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    if schedule == "constant":
        return peak
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * peak * (1.0 + math.cos(math.pi * min(1.0, progress)))


class Schedule:
    """The run's learning rate at every step, for ``slices`` batches of ``optim.batch_size`` per step."""

    def __init__(self, optim, steps_per_epoch: int, slices: int):
        self.peak = peak_learning_rate(
            optim.lr, optim.batch_size * slices, optim.base_batch_size, optim.lr_scaling
        )
        self.total_steps = steps_per_epoch * optim.epochs
        self.warmup_steps = round(optim.warmup_epochs * steps_per_epoch)
        self.kind = optim.schedule

    def __call__(self, step: int) -> float:
        return learning_rate_at(
            step,
            peak=self.peak,
            total_steps=self.total_steps,
            warmup_steps=self.warmup_steps,
            schedule=self.kind,
        )
