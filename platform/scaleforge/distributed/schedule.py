"""Learning-rate rules for data-parallel training (Goyal et al. 2017, "Accurate, Large Minibatch SGD")."""

import math


def peak_learning_rate(lr: float, global_batch: int, base_batch: int, scaling: str) -> float:
    """The linear scaling rule: multiply ``lr`` by ``global_batch / base_batch`` when ``scaling == "linear"``."""
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
