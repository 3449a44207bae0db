"""Train a small classifier in one process and export it as an artifact.

For tests and benchmarks that need real trained models in seconds (serving, routing), without a
Ray Train run. Real jobs train with ``jobs.train``; the artifacts are the same format.
"""

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from scaleforge.artifacts import save_artifact
from scaleforge.models import build_model


def fit_classifier(spec, x: np.ndarray, y: np.ndarray, *, epochs: int, batch_size: int = 256, lr: float = 3e-3,
                   seed: int = 0) -> nn.Module:
    """AdamW with a one-cycle schedule over ``(x, y)``; returns the model in eval mode.

    Args:
        spec: A registered model spec (``MLPSpec``, ``CNN1dSpec``, ``MoESpec`` ...).
        x: [examples, features] float32.
        y: [examples] int64 labels.
    """
    torch.manual_seed(seed)
    num_classes = int(y.max()) + 1
    model = build_model(spec, x.shape[1], num_classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
    steps = epochs * -(-len(inputs) // batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(inputs))
        for start in range(0, len(inputs), batch_size):
            rows = order[start:start + batch_size]
            loss = F.cross_entropy(model(inputs[rows]), labels[rows])
            if hasattr(model, "aux_loss"):
                loss = loss + model.aux_loss()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return model.eval()


@torch.no_grad()
def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Share of ``x`` that ``model`` classifies as ``y``."""
    return float((model(torch.from_numpy(x)).argmax(dim=-1).numpy() == y).mean())


def fit_and_save(path: str | Path, spec, data: dict[str, np.ndarray], *, epochs: int, **fit_args) -> Path:
    """Train on ``data['x'], data['y']``, record test accuracy, export an artifact at ``path``."""
    model = fit_classifier(spec, data["x"], data["y"], epochs=epochs, **fit_args)
    metrics = {"test_accuracy": accuracy(model, data["x_test"], data["y_test"])}
    return save_artifact(path, model, spec, input_dim=data["x"].shape[1], num_classes=int(data["y"].max()) + 1,
                         metrics=metrics)
