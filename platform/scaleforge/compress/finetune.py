"""Fine-tuning after pruning or factorization: the library's one-process fit loop at a small, constant lr."""

import numpy as np
import torch
from torch import nn

from scaleforge.compress.steps import FinetuneSpec
from scaleforge.quickfit import accuracy, fit

__all__ = ["accuracy", "finetune"]


def finetune(model: nn.Module, x: np.ndarray, y: np.ndarray, spec: FinetuneSpec) -> nn.Module:
    """``spec.epochs`` passes of AdamW at ``spec.lr`` (Han et al. retrain at about a tenth of the
    original lr) over (x, y), in place, shuffled by ``spec.seed``."""
    return fit(
        model,
        x,
        y,
        epochs=spec.epochs,
        batch_size=spec.batch_size,
        lr=spec.lr,
        generator=torch.Generator().manual_seed(spec.seed),
    )
