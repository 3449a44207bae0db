"""Multi-layer perceptron over the flat input vector."""

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn


class MLPSpec(BaseModel):
    """Architecture of an :class:`MLP`."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["mlp"] = "mlp"
    hidden: list[int] = Field(default=[256, 256], min_length=1)
    """Width of each hidden layer, input to output."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout probability after each hidden activation."""


class MLP(nn.Module):
    """Linear -> ReLU (-> Dropout) blocks followed by a linear classifier."""

    def __init__(self, spec: MLPSpec, input_dim: int, num_classes: int):
        super().__init__()
        layers: list[nn.Module] = []
        width = input_dim
        for size in spec.hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            if spec.dropout:
                layers.append(nn.Dropout(spec.dropout))
            width = size
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
