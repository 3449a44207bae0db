"""Training in one process on in-memory arrays: the one plain-torch fit loop of the library.

Used where a Ray Train run would be overkill: fine-tuning after pruning or factorization
(``scaleforge.compress``, inside a Ray task or the driver), and tests and benchmarks that need a
real trained model in seconds. Real jobs train with ``jobs.train``; the artifacts are the same format.
The same loop fits a language model on token windows (integer ``x``, a label per token in ``y``).
"""

import math
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from scaleforge.artifacts import save_artifact
from scaleforge.models import build_model

Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss(model, inputs, labels)``: a scalar to minimise on one batch."""


def cross_entropy(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the model's logits (per token for a language model), plus its ``aux_loss()``
    (MoE balancing losses) when it has one."""
    loss = F.cross_entropy(model(inputs).flatten(0, -2), labels.flatten())
    return loss + model.aux_loss() if hasattr(model, "aux_loss") else loss


def fit(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float = 0.0,
    generator: Optional[torch.Generator] = None,
    one_cycle: bool = False,
    loss: Loss = cross_entropy,
) -> nn.Module:
    """``epochs`` shuffled passes of AdamW over ``(x, y)``, in place; returns the model in eval mode.

    Args:
        model: Any classifier or language model.
        x: [examples, features] float32, or a language model's [windows, tokens] integer token ids.
        y: [examples] int64 labels, or [windows, tokens] next tokens.
        generator: Shuffling RNG (default: torch's global one).
        one_cycle: One-cycle learning rate (warm-up, then annealing) instead of a constant ``lr``.
            Pruning masks registered by ``torch.nn.utils.prune`` stay applied (their forward hooks
            multiply the weights), so pruned weights stay zero.
        loss: The objective per batch (default: :func:`cross_entropy`; an early-exit network's
            joint loss over its exits: ``scaleforge.models.early_exit.joint_loss``).
    """
    if epochs == 0:
        return model
    inputs, labels = as_inputs(x), torch.as_tensor(y, dtype=torch.int64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps = epochs * -(-len(inputs) // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps) if one_cycle else None
    model.train()
    for _ in range(epochs):
        for rows in torch.randperm(len(inputs), generator=generator).split(batch_size):
            value = loss(model, inputs[rows], labels[rows])
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            optimizer.step()
            if schedule is not None:
                schedule.step()
    return model.eval()


@torch.inference_mode()
def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = 1024) -> float:
    """Share of ``x`` that ``model`` (put in eval mode) classifies as ``y``."""
    model.eval()
    inputs = torch.as_tensor(x, dtype=torch.float32)
    predictions = torch.cat([model(chunk).argmax(-1) for chunk in inputs.split(batch_size)])
    return float((predictions.numpy() == y).mean())


@torch.inference_mode()
def bits_per_byte(
    model: nn.Module, x: np.ndarray, y: np.ndarray, bytes_per_token: float = 1.0, batch_size: int = 64
) -> float:
    """A language model's cross-entropy over every next token of ``(x, y)`` ([windows, tokens] each),
    in bits per byte of text: nats summed over the tokens, per token, / ln 2, / bytes per token."""
    model.eval()
    inputs, labels = as_inputs(x), torch.as_tensor(y, dtype=torch.int64)
    nats = sum(
        F.cross_entropy(model(chunk).flatten(0, -2), target.flatten(), reduction="sum").item()
        for chunk, target in zip(inputs.split(batch_size), labels.split(batch_size))
    )
    return nats / labels.numel() / math.log(2) / bytes_per_token


def as_inputs(x: np.ndarray) -> torch.Tensor:
    """Token ids stay integers (an embedding looks them up); features become float32."""
    return torch.as_tensor(x, dtype=torch.int64 if np.issubdtype(x.dtype, np.integer) else torch.float32)


def fit_classifier(
    spec, x: np.ndarray, y: np.ndarray, *, epochs: int, batch_size: int = 256, lr: float = 3e-3, seed: int = 0
) -> nn.Module:
    """A fresh registry model (``spec``: ``MLPSpec``, ``CNN1dSpec`` ...) trained with a one-cycle
    schedule; returns it in eval mode."""
    torch.manual_seed(seed)
    model = build_model(spec, x.shape[1], int(y.max()) + 1)
    return fit(model, x, y, epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=1e-4, one_cycle=True)


def fit_and_save(path: str | Path, spec, data: dict[str, np.ndarray], *, epochs: int, **fit_args) -> Path:
    """Train on ``data['x'], data['y']``, record test accuracy, export an artifact at ``path``."""
    model = fit_classifier(spec, data["x"], data["y"], epochs=epochs, **fit_args)
    metrics = {"test_accuracy": accuracy(model, data["x_test"], data["y_test"])}
    return save_artifact(
        path, model, spec, input_dim=data["x"].shape[1], num_classes=int(data["y"].max()) + 1, metrics=metrics
    )
