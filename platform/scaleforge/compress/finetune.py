"""Fine-tuning and evaluation on in-memory arrays (plain torch, one process: a Ray task or the driver)."""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from scaleforge.config.compress import FinetuneSpec


def finetune(model: nn.Module, x: np.ndarray, y: np.ndarray, spec: FinetuneSpec) -> nn.Module:
    """``spec.epochs`` passes of AdamW at a constant, small lr over (x, y), in place.

    Pruning masks registered by ``torch.nn.utils.prune`` stay applied (their forward hooks
    multiply the weights), so pruned weights stay zero.
    """
    if spec.epochs == 0:
        return model
    generator = torch.Generator().manual_seed(spec.seed)
    inputs, labels = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.int64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    model.train()
    for _ in range(spec.epochs):
        for batch in torch.randperm(len(inputs), generator=generator).split(spec.batch_size):
            loss = F.cross_entropy(model(inputs[batch]), labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return model.eval()


@torch.inference_mode()
def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = 1024) -> float:
    """Share of ``x`` that ``model`` (put in eval mode) classifies as ``y``."""
    model.eval()
    inputs = torch.as_tensor(x, dtype=torch.float32)
    predictions = torch.cat([model(chunk).argmax(1) for chunk in inputs.split(batch_size)])
    return float((predictions.numpy() == y).mean())
